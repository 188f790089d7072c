"""Request bodies as every endpoint takes them: unencoded, and a body that breaks is the client's 400.

``Content-Encoding`` (gzip, deflate, br, anything but ``identity``) is refused with 415
``unsupported_encoding`` before the handler runs, on every route. No client of this API compresses
what it sends (a JSON body or a speech clip is a few KB), and decoding would make the body limit
count inflated bytes in every reader, multipart included; refusing costs one header check. The
runner does not inflate bodies either (``auto_decompress=False``, server.py), so a zip bomb is
never expanded, not even while the rest of a refused body is read and dropped.

A body that breaks while a handler reads it (a bad chunk, a client gone before its
``Content-Length`` arrived) raises aiohttp's ``HttpProcessingError`` or ``ConnectionResetError``
in the handler, which aiohttp would answer 500 with a traceback each; here it is 400
``invalid_body`` (its line in the access log, where nobody is left to read it).

Both refusals go through ``Gateway.refuse`` (counted by code, logged at the bounded rate). The
415 also spends a session token the request carries, as admission would have (auth.py).
"""

from __future__ import annotations

import contextlib

from aiohttp import hdrs, web
from aiohttp.http_exceptions import HttpProcessingError

from .auth import AuthError, api_key_from_headers, token_from_request
from .gateway import GATEWAY
from .proxy import Handler

IDENTITY = ("", "identity")


@web.middleware
async def request_body_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    # Every Content-Encoding header: a second one must not slip past behind an "identity".
    encoding = ",".join(request.headers.getall(hdrs.CONTENT_ENCODING, ())).strip().lower()
    if encoding not in IDENTITY:
        with contextlib.suppress(AuthError):  # admission's first two steps, for their side effect
            gw.auth.check_origin(request.headers.get("Origin"))
            gw.auth.authorize(
                api_key=api_key_from_headers(request.headers),
                token=token_from_request(request.query, request.headers),
            )
        return gw.refuse(
            request, 415, "unsupported_encoding", "send the body without a Content-Encoding (identity)"
        )
    try:
        return await handler(request)
    except HttpProcessingError as err:
        why = f"the body could not be read ({type(err).__name__})"
    except ConnectionResetError:
        if request.transport is not None and not request.transport.is_closing():
            raise  # not the client's connection: the server's own failure, with its traceback
        why = "the connection closed before the body was complete"  # answered to no one: the log's
    # The body cannot be read to its end: close rather than linger on what is left of it.
    resp = gw.refuse(request, 400, "invalid_body", why)
    resp.force_close()
    return resp
