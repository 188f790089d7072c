"""A WebRTC offer as ``POST /offer`` reads it: the JSON body, the SDP lines aiortc's parser would
choke on (each refused with a 4xx that says where), the media the call needs, and only the ICE
candidates the server may check (ice.py)."""

from __future__ import annotations

import re

from aiohttp import web
from aiortc.sdp import SessionDescription

from .gateway import GATEWAY, RequestError
from .http_api import read_json_body
from .ice import filter_candidates, gathered_families

CONTROL_LABEL = "control"  # the data channel that carries protocol v1 JSON


# RFC 8839's candidate-attribute as aiortc's parser reads it (it asserts there are 8 fields and
# int()s the component, priority, port, rport and generation): foundation component transport
# priority address port "typ" type, then name-value pairs.
_CANDIDATE_INTEGERS = ((1, "component", 1, 256), (3, "priority", 0, 2**32 - 1), (5, "port", 0, 65_535))
_INTEGER_EXTENSIONS = ("rport", "generation")
_DIGITS = re.compile(r"[0-9]{1,10}")  # ASCII digits only: int() also takes "\u0661" and "1_0"


def _candidate_problem(line: str) -> str | None:
    """What makes an ``a=candidate:`` line unreadable, or None for one aiortc can parse."""
    fields = line.removeprefix("a=candidate:").split()
    if len(fields) < 8 or fields[6] != "typ":
        return "needs foundation, component, transport, priority, address, port, typ and a type"
    for at, name, low, high in _CANDIDATE_INTEGERS:
        if not (_DIGITS.fullmatch(fields[at]) and low <= int(fields[at]) <= high):
            return f"has a {name} that is not an integer within {low}..{high}"
    for name, value in zip(fields[8::2], fields[9::2], strict=False):
        if name in _INTEGER_EXTENSIONS and not _DIGITS.fullmatch(value):
            return f"has a {name} that is not an integer"
    return None


async def read_offer(request: web.Request) -> str:
    """The offer's SDP, with only the ICE candidates the server may check; RequestError
    with a 4xx status."""
    config = request.app[GATEWAY].config
    body = await read_json_body(request, config.http_body_timeout_s)  # RequestError: 4xx as it is
    if not isinstance(body, dict):
        raise RequestError(400, "invalid_request", 'the body must be {"sdp": ..., "type": "offer"}')
    if body.get("type") != "offer":
        raise RequestError(400, "invalid_type", 'type must be "offer"')
    sdp = body.get("sdp")
    if not isinstance(sdp, str) or not sdp.startswith("v=0"):
        raise RequestError(400, "invalid_sdp", "sdp must be a session description string starting with v=0")
    for number, line in enumerate(sdp.splitlines(), 1):
        problem = _candidate_problem(line) if line.startswith("a=candidate:") else None
        if problem is not None:  # one code for any SDP the server cannot read; the line says where
            raise RequestError(400, "invalid_sdp", f"the ICE candidate on line {number} {problem}")
    try:
        media = SessionDescription.parse(sdp).media
    except Exception:  # aiortc's parser raises AssertionError, ValueError, IndexError... on bad SDP
        raise RequestError(400, "invalid_sdp", "the SDP could not be parsed: a line is malformed") from None
    if not any(
        m.kind == "audio" and any(c.mimeType.lower() == "audio/opus" for c in m.rtp.codecs) for m in media
    ):
        raise RequestError(
            400, "no_audio", "the offer needs an audio section with Opus (a recvonly transceiver)"
        )
    if not any(m.kind == "application" for m in media):
        raise RequestError(400, "no_data_channel", f"the offer needs a data channel labelled {CONTROL_LABEL!r}")
    # aiortc checks ICE credentials but not fingerprints: without one, DTLS fails later, silently.
    if not all(
        m.ice and m.ice.usernameFragment and m.ice.password and m.dtls and m.dtls.fingerprints for m in media
    ):
        raise RequestError(
            400, "invalid_sdp", "every media section needs ice-ufrag, ice-pwd and a DTLS fingerprint"
        )
    candidates = sum(line.startswith("a=candidate:") for line in sdp.splitlines())
    if candidates > config.max_offer_candidates:
        raise RequestError(
            400,
            "too_many_candidates",
            f"an offer may carry at most {config.max_offer_candidates} ICE candidates, not {candidates}",
        )
    return filter_candidates(sdp, gathered_families())
