"""The smallest backend that lets the demo page call a voicewire that has an API key.

A page cannot hold the key: anyone could read it. It asks this backend instead, which holds the key
server-side and mints a single-use session token for the page (POST /v1/session-tokens, valid for
at most 5 minutes). Start voicewire with ``--api-key KEY --demo-token-url http://HOST:8090/session-token``
and this next to it:

    VOICEWIRE_URL=http://127.0.0.1:8080 VOICEWIRE_API_KEY=KEY \\
    VOICEWIRE_PAGE_ORIGIN=http://127.0.0.1:8080 python deploy/token_backend.py --port 8090

This is where your own sign-in belongs: check the user's session cookie in ``session_token``
before minting (the page sends its cookies with the request). As written it gives a token to any
page of ``VOICEWIRE_PAGE_ORIGIN`` that asks.
"""

from __future__ import annotations

import argparse
import os

import aiohttp
from aiohttp import web


def make_app(voicewire_url: str, api_key: str, page_origin: str) -> web.Application:
    async def session_token(request: web.Request) -> web.Response:
        cors = {"Access-Control-Allow-Origin": page_origin, "Access-Control-Allow-Credentials": "true", "Vary": "Origin"}
        if request.headers.get("Origin") != page_origin:
            return web.json_response({"error": "not the demo page's origin"}, status=403)
        # (your sign-in check goes here)
        async with aiohttp.ClientSession() as http, http.post(
            f"{voicewire_url}/v1/session-tokens", headers={"Authorization": f"Bearer {api_key}"}
        ) as r:
            body = await r.json()
            if r.status != 200:
                return web.json_response({"error": body.get("error")}, status=502, headers=cors)
        return web.json_response({"token": body["token"], "expires_at": body["expires_at"]}, headers=cors)

    app = web.Application()
    app.router.add_post("/session-token", session_token)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090)
    args = parser.parse_args()
    app = make_app(
        os.environ.get("VOICEWIRE_URL", "http://127.0.0.1:8080"),
        os.environ["VOICEWIRE_API_KEY"],
        os.environ.get("VOICEWIRE_PAGE_ORIGIN", "http://127.0.0.1:8080"),
    )
    web.run_app(app, host=args.host, port=args.port)


if __name__ == "__main__":
    main()
