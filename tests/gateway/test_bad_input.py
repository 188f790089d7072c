"""Bad input the model or aiortc would choke on gets a stable, documented code and a short message:
an unknown language is 400 ``invalid_request``; a malformed ICE candidate is 400 ``invalid_sdp``
naming its line, not aiortc's ``AssertionError``; what a client sent is echoed cut short."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import aiohttp
import pytest

from tests.conftest import running_gateway
from voicewire.engine import Engine, EngineConfig, StreamParams
from voicewire.engine.model import ModelError
from voicewire.engine.models.hibari_voice import HibariModel
from voicewire.realtime.client.webrtc import WebRtcClient

pytestmark = pytest.mark.shared_cores  # codes and messages: nothing timed

MAX_MESSAGE_CHARS = 450  # an engine's message quoting the input, and the list of what it takes


class _Languages(HibariModel):
    """The embedded voice refusing a language it does not know where Qwen3-TTS does: as the
    stream's slot opens (engine/qwen3/slot_request.py)."""

    def open_slot(self, slot: int, params: StreamParams) -> None:
        if params.language.lower() not in ("", "auto", "english"):
            raise ModelError(slot, f"unknown language {params.language!r}; languages: auto, english")
        super().open_slot(slot, params)


@pytest.fixture(scope="module")
def languages() -> Iterator[Engine]:
    engine = Engine(EngineConfig(), model=_Languages()).start()
    yield engine
    engine.close()


async def test_an_unknown_language_is_invalid_request(languages: Engine) -> None:
    async with running_gateway(languages) as base, aiohttp.ClientSession() as http:
        for language, status, code in [
            ("English", 200, ""),
            ("klingon", 400, "invalid_request"),
            ("x" * 10_000, 400, "invalid_request"),
        ]:
            body = {"input": "Hello there.", "language": language}
            async with http.post(f"http://{base}/v1/audio/speech", json=body) as r:
                assert r.status == status, (language[:20], await r.text())
                if status != 200:
                    error = (await r.json())["error"]
                    assert error["code"] == code
                    assert len(error["message"]) <= MAX_MESSAGE_CHARS


async def _real_offer() -> str:
    client = WebRtcClient()
    client.pc.addTransceiver("audio", direction="recvonly")
    client.pc.createDataChannel("control")
    await client.pc.setLocalDescription(await client.pc.createOffer())
    sdp = str(client.pc.localDescription.sdp)
    await client.close()
    return sdp


GOOD = "1 1 udp 2122260223 127.0.0.1 5000 typ host"
BAD_CANDIDATES = [
    "abc",  # aiortc's parser asserted: "AssertionError"
    "1 1 udp 2122260223 127.0.0.1 notaport typ host",  # int() failed: "ValueError"
    "1 1 udp 2122260223 127.0.0.1 70000 typ host",
    "1 \u0661 udp 2122260223 127.0.0.1 5000 typ host",  # an Arabic-Indic digit: int() takes it
    "1 1 udp 99999999999 127.0.0.1 5000 typ host",
    "1 1 udp 2122260223 127.0.0.1 5000 kind host",
    "1 1 udp 1686052607 198.51.100.1 5000 typ srflx raddr 0.0.0.0 rport x",
    "1 1 udp 2122260223 127.0.0.1 5000 typ host generation zero",
]


async def test_a_malformed_ice_candidate_names_its_line(engine: Engine) -> None:
    real_offer = await _real_offer()
    assert "a=end-of-candidates" in real_offer
    async with running_gateway(engine) as base, aiohttp.ClientSession() as http:
        for candidate in BAD_CANDIDATES:
            sdp = real_offer.replace("a=end-of-candidates", f"a=candidate:{candidate}\r\na=end-of-candidates")
            async with http.post(f"http://{base}/offer", json={"sdp": sdp, "type": "offer"}) as r:
                error = (await r.json())["error"]
            assert (r.status, error["code"]) == (400, "invalid_sdp"), (candidate, error)
            line = sdp.splitlines().index(f"a=candidate:{candidate}") + 1
            assert f"line {line}" in error["message"] and "Error" not in error["message"], (candidate, error)
        # any other line aiortc cannot read: the same code, and no exception's name
        sdp = re.sub(r"^m=audio \d+", "m=audio x", real_offer, flags=re.M)
        assert sdp != real_offer
        async with http.post(f"http://{base}/offer", json={"sdp": sdp, "type": "offer"}) as r:
            error = (await r.json())["error"]
        assert (r.status, error["code"]) == (400, "invalid_sdp") and "Error" not in error["message"], error
        # a well-formed candidate is taken
        sdp = real_offer.replace("a=end-of-candidates", f"a=candidate:{GOOD}\r\na=end-of-candidates")
        async with http.post(
            f"http://{base}/offer",
            data=json.dumps({"sdp": sdp, "type": "offer"}),
            headers={"Content-Type": "application/json"},
        ) as r:
            assert r.status == 200, await r.text()
