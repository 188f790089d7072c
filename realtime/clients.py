"""Who a request is, for the per-client quotas: the API key it presented, else its address.

A server-to-server client is its key (a digest of it: the key itself never sits in memory
tables or metrics); a browser with a session token, or any request with auth off, is the
address it comes from (behind ``--trusted-proxy``, the forwarded client's: ``proxy.py``). Tokens
are single-use and carry no owner, so the browsers of one backend are told apart by address.
"""

from __future__ import annotations

import hashlib

from aiohttp import web

from .auth import api_key_from_headers, token_from_request
from .proxy import client_address


def client_id(request: web.BaseRequest, auth_enabled: bool) -> str:
    """``key:<digest>`` for a request that presents an API key while auth is on (admission has
    checked it), ``addr:<address>`` otherwise: with auth off a key costs nothing to invent, so it
    cannot buy a fresh quota."""
    if auth_enabled and token_from_request(request.query, request.headers) is None:
        key = api_key_from_headers(request.headers)
        if key:
            digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:16]
            return f"key:{digest}"
    return f"addr:{client_address(request)}"
