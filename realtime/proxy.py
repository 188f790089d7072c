"""Requests that come through a trusted reverse proxy: the client's address, scheme and host from
``X-Forwarded-For``, ``-Proto`` and ``-Host``.

Off unless ``GatewayConfig.trusted_proxies`` names the proxy: anyone can send these headers, so
they are believed only from a peer in that list. ``X-Forwarded-For`` is read right to left (each
proxy appends the address it saw): the client is the first hop that is not itself a trusted
proxy. An edge proxy should overwrite the header with the address it saw (nginx:
``proxy_set_header X-Forwarded-For $remote_addr``), so that what a client sends itself never
reaches this far. ``-Proto`` and ``-Host`` are taken from the last value, the one the nearest
proxy set.

The handler sees a request whose ``remote``, ``scheme`` and ``host`` are the client's; access logs
and refusal logs name ``client_address(request)``.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from multidict import CIMultiDictProxy

from .config import parse_networks

CLIENT = web.RequestKey("voicewire.client", str)  # the client's address as the logs name it
# A host, optionally with a port: a name or an IPv4 literal, or a bracketed IPv6 literal.
_HOST = re.compile(r"^(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?$")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Forwarded:
    remote: str  # the client's address
    scheme: str | None  # "http" / "https" as the client spoke it, when the proxy said
    host: str | None  # the Host the client asked for, when the proxy said


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        return None
    # A dual-stack socket reports an IPv4 peer as ::ffff:a.b.c.d; --trusted-proxy names a.b.c.d.
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return mapped or address


def _trusted(address: ipaddress.IPv4Address | ipaddress.IPv6Address, networks: tuple[Network, ...]) -> bool:
    return any(address in n for n in networks)


def _last(headers: CIMultiDictProxy[str], name: str) -> str | None:
    values = [v.strip() for line in headers.getall(name, ()) for v in line.split(",") if v.strip()]
    return values[-1] if values else None


def resolve(
    peer: str | None, headers: CIMultiDictProxy[str], networks: tuple[Network, ...]
) -> Forwarded | None:
    """The client behind the proxies, or None when ``peer`` is not a trusted proxy."""
    peer_address = _address(peer) if peer else None
    if peer_address is None or not _trusted(peer_address, networks):
        return None
    remote = peer_address
    hops = [h for line in headers.getall("X-Forwarded-For", ()) for h in line.split(",")]
    for hop in reversed(hops):
        address = _address(hop)
        if address is None:  # "unknown", a name, garbage: nothing left of it can be believed
            break
        remote = address
        if not _trusted(address, networks):
            break
    scheme = _last(headers, "X-Forwarded-Proto")
    host = _last(headers, "X-Forwarded-Host")
    return Forwarded(
        remote=str(remote),
        scheme=scheme.lower() if scheme and scheme.lower() in ("http", "https") else None,
        host=host if host and _HOST.match(host) else None,
    )


def client_address(request: web.BaseRequest) -> str:
    """The address logs name: the forwarded client's behind a trusted proxy, else the peer's."""
    return str(request.get(CLIENT) or request.remote or "-")


def trusted_proxy_middleware(trusted: tuple[str, ...]) -> Any:  # aiohttp's middleware type
    """Middleware that hands handlers the forwarded client's request (see the module docstring)."""
    networks = parse_networks(trusted)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        forwarded = resolve(request.remote, request.headers, networks)
        if forwarded is None:
            return await handler(request)
        # On the original too: the access log is written from it, after the handler.
        request[CLIENT] = forwarded.remote
        return await handler(
            request.clone(
                remote=forwarded.remote,
                scheme=forwarded.scheme or request.scheme,
                host=forwarded.host or request.host,
            )
        )

    return middleware
