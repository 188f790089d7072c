"""ICE on the server side: aioice's process-wide knobs, the offer's candidates the server may send
checks to, and the peer connection's configuration (STUN/TURN servers)."""

from __future__ import annotations

import ipaddress

import aioice.ice
from aiortc import RTCConfiguration, RTCIceServer

from .config import GatewayConfig

_STOCK_GET_HOST_ADDRESSES = aioice.ice.get_host_addresses


def install_ice_knobs(config: GatewayConfig) -> None:
    """Set aioice's host addresses and consent timing (process-wide: aioice has no per-connection
    option for either).

    Stock aioice skips 127.0.0.1, so a gateway bound to loopback inside a container with no LAN
    offers no candidate at all and ICE never starts (chromium-webrtc.md T1). aioice calls the
    function with keyword arguments, so the replacement keeps its parameter names. The consent
    constants are read by aioice on every check, so setting them here takes effect for new calls.
    """
    fixed = config.ice_host_addresses
    add_loopback = fixed is None and _is_loopback(config.host)

    def get_host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        if fixed is not None:
            return list(fixed)
        found = _STOCK_GET_HOST_ADDRESSES(use_ipv4=use_ipv4, use_ipv6=use_ipv6)
        return ["127.0.0.1", *found] if add_loopback and use_ipv4 else found

    aioice.ice.get_host_addresses = get_host_addresses
    aioice.ice.CONSENT_INTERVAL = config.ice_consent_interval_s  # type: ignore[assignment]
    aioice.ice.CONSENT_FAILURES = config.ice_consent_failures


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def gathered_families() -> set[int]:
    """IP versions of the server's own host candidates (what ``install_ice_knobs`` set)."""
    hosts = aioice.ice.get_host_addresses(use_ipv4=True, use_ipv6=True)
    return {ipaddress.ip_address(h).version for h in hosts}


def filter_candidates(sdp: str, families: set[int]) -> str:
    """Keep only the offer's candidates the server should send connectivity checks to: IP
    literals of a family it gathers itself, unicast.

    ``<uuid>.local`` mDNS names (and any other host name) go: aioice would resolve each with a
    multicast query and wait its 1 s timeout before answering (chromium-webrtc.md T2). The call
    still connects without them: the browser reaches the server's own candidate and ICE learns
    the peer-reflexive address. Candidates of another family or a multicast/unspecified address
    could only make the server send checks where no peer of this call listens.
    """
    lines = sdp.splitlines(keepends=True)
    return "".join(line for line in lines if not _unusable_candidate(line, families))


def _unusable_candidate(line: str, families: set[int]) -> bool:
    if not line.startswith("a=candidate:"):
        return False
    fields = line.split()
    if len(fields) < 8:
        return True
    try:
        address = ipaddress.ip_address(fields[4])
    except ValueError:
        return True  # a host name: mDNS or anything else that needs a lookup
    return address.version not in families or address.is_multicast or address.is_unspecified


def rtc_configuration(config: GatewayConfig) -> RTCConfiguration:
    # iceServers=[] and not None: aiortc's default for None is a public Google STUN server.
    servers = [RTCIceServer(list(s.urls), s.username, s.credential) for s in config.ice_servers]
    return RTCConfiguration(iceServers=servers)
