"""The Python client (realtime/client/) against a real gateway: the one-call hook and barge-in."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tests.asr import transcribe, wer
from tests.conftest import running_gateway
from voicewire.engine import Engine
from voicewire.realtime.client import ReceivedAudio, VoicewireClient, VoicewireError, delta_text, stream_url

REPLY = "Sure, I can help with that. Your order shipped this morning and should arrive by Thursday."
LONG_REPLY = (
    "Thanks for calling, I can help with that. Your order shipped this morning and the tracking "
    "number is on its way to your inbox. It should arrive by Thursday, and you can change the "
    "delivery address until tomorrow evening."
)


def _chunk(content: str | None, role: str | None = None) -> Any:
    """The shape of an OpenAI ChatCompletionChunk, as the openai package builds it."""
    return SimpleNamespace(choices=[SimpleNamespace(index=0, delta=SimpleNamespace(role=role, content=content))])


async def fake_chat_completion(text: str, tokens_per_s: float) -> AsyncIterator[Any]:
    """A streaming chat completion: a role-only chunk, ~word-sized content chunks, a usage chunk."""
    yield _chunk(None, role="assistant")
    words = text.split(" ")
    for i, w in enumerate(words):
        await asyncio.sleep(1 / tokens_per_s)
        yield _chunk(w if i == len(words) - 1 else w + " ")
    yield SimpleNamespace(choices=[], usage=SimpleNamespace(total_tokens=len(words)))


def _pcm(chunks: list[ReceivedAudio]) -> np.ndarray:
    return np.concatenate([c.pcm() for c in chunks]).astype(np.float32) / 32768.0


def test_delta_text_reads_strings_objects_and_dicts() -> None:
    assert delta_text("hi ") == "hi "
    assert delta_text(_chunk("there")) == "there"
    assert delta_text(_chunk(None, role="assistant")) == ""
    assert delta_text({"choices": [{"delta": {"content": "dict"}}]}) == "dict"
    assert delta_text({"choices": []}) == ""
    assert delta_text(SimpleNamespace(choices=[])) == ""


async def test_speak_hook_speaks_a_streaming_chat_completion(engine: Engine) -> None:
    async with running_gateway(engine) as base:
        client = await VoicewireClient.connect(f"http://{base}")
        turn = client.speak(fake_chat_completion(REPLY, tokens_per_s=30))
        chunks = [c async for c in turn]
        done = await turn.done()
        await client.close()

    assert done.reason == "completed"
    assert done.text_spoken == REPLY
    assert turn.t_first_text_s is not None and turn.t_first_audio_s is not None
    pcm = _pcm(chunks)
    assert abs(pcm.size / 24_000 * 1000 - done.audio_ms) < 1.0
    heard = transcribe(pcm, 24_000)
    assert wer(REPLY, heard) <= 0.15, heard


async def test_barge_in_reports_what_was_sent_and_its_words(engine: Engine) -> None:
    """WebSocket: the server knows what it sent; played_ms and text_spoken must match that audio."""
    async with running_gateway(engine) as base:
        client = await VoicewireClient.connect(f"http://{base}")
        # An LLM slower than speech, so the turn is still open after a second of it.
        turn = client.speak(fake_chat_completion(LONG_REPLY, tokens_per_s=6))
        chunks: list[ReceivedAudio] = []

        async def read() -> None:
            async for c in turn:
                chunks.append(c)

        reader = asyncio.create_task(read())
        while not chunks:
            await asyncio.sleep(0.01)
        await asyncio.sleep(1.0)  # the listener has heard ~1 s
        t_cancel = time.perf_counter()
        done = await turn.cancel()
        cancel_ms = (time.perf_counter() - t_cancel) * 1000
        await reader
        await client.close()

    assert done.reason == "cancelled"
    assert cancel_ms < 200
    received_ms = sum(c.duration_s for c in chunks) * 1000
    assert abs(done.played_ms - received_ms) <= 100
    _check_prefix(done.text_spoken, LONG_REPLY, _pcm(chunks), 24_000)


def _check_prefix(text_spoken: str, full: str, pcm: np.ndarray, rate_hz: int) -> None:
    """text_spoken is the start of the reply, and the words the received audio holds."""
    assert text_spoken and full.startswith(text_spoken), text_spoken
    assert len(text_spoken) < len(full)
    heard = transcribe(pcm, rate_hz)
    n_spoken, n_heard = len(text_spoken.split()), len(heard.split())
    assert abs(n_spoken - n_heard) <= 1, (text_spoken, heard)
    assert wer(text_spoken, heard) <= 0.34, (text_spoken, heard)


async def test_refusals_and_empty_turns(engine: Engine) -> None:
    async with running_gateway(engine) as base:
        with pytest.raises(VoicewireError) as refused:
            await VoicewireClient.connect(f"http://{base}", voice="no-such-voice")
        assert refused.value.code == "invalid_voice"
        async with await VoicewireClient.connect(f"http://{base}", format="opus", sample_rate_hz=48_000) as client:
            assert (client.audio_format, client.sample_rate_hz) == ("opus", 48_000)
            empty = await client.start_turn()
            await empty.end()  # no text: done at once, nothing sent
            assert (await empty.done(1.0)).audio_ms == 0.0
            turn = client.speak(["Hello there."])  # a plain iterable of str deltas works too
            packets = [c async for c in turn]
            assert packets and all(c.format == "opus" for c in packets)
            assert abs(len(packets) * 20 - (await turn.done()).audio_ms) <= 20
            with pytest.raises(VoicewireError):
                await turn.send("more")  # the turn is over
    # a session the server refuses at the handshake is a VoicewireError with the server's code
    async with (
        running_gateway(engine, max_sessions=1) as base,
        await VoicewireClient.connect(f"http://{base}"),
    ):
        with pytest.raises(VoicewireError) as full:
            await VoicewireClient.connect(f"http://{base}")
        assert full.value.code == "too_many_sessions" and "503" in full.value.message


async def test_api_key_for_a_server_that_requires_one(engine: Engine) -> None:
    from voicewire.realtime.auth import AuthConfig
    from voicewire.realtime.client.webrtc import WebRtcClient

    key = "probe-test-key-0123456789"
    async with running_gateway(engine, auth=AuthConfig(api_keys=(key,))) as base:
        with pytest.raises(Exception, match="401"):
            await VoicewireClient.connect(f"http://{base}")
        async with await VoicewireClient.connect(f"http://{base}", api_key=key) as client:
            turn = client.speak(["Hi."])
            assert [c async for c in turn] and (await turn.done()).reason == "completed"
        rtc = await WebRtcClient.connect(f"http://{base}", api_key=key)
        assert rtc.session["protocol"] == 1
        await rtc.close()


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("http://127.0.0.1:8080", "ws://127.0.0.1:8080/v1/stream"),
        ("127.0.0.1:8080", "ws://127.0.0.1:8080/v1/stream"),
        ("https://voice.example/voice/", "wss://voice.example/voice/v1/stream"),  # under --base-path
        ("http://h:1/v1/stream?token=t", "ws://h:1/v1/stream?token=t"),
        ("ws://h:1", "ws://h:1/v1/stream"),
        ("wss://h/custom/socket", "wss://h/custom/socket"),  # a socket URL is taken as it is
    ],
)
def test_stream_url_from_a_base_url(given: str, expected: str) -> None:
    assert stream_url(given) == expected


async def test_cancel_after_the_reply_was_all_sent_returns_what_played(engine: Engine) -> None:
    """The whole reply arrives long before it plays: ``Turn.cancel(played_ms=...)`` after its
    ``turn.done`` returns the words of the audio played, from the server's ``turn.truncated``."""
    async with running_gateway(engine) as base:
        client = await VoicewireClient.connect(f"http://{base}")
        turn = client.speak([LONG_REPLY])
        chunks = [c async for c in turn]
        sent = await turn.done()
        done = await turn.cancel(played_ms=1000)
        await client.close()

    assert sent.reason == "completed" and sent.text_spoken == LONG_REPLY
    assert done.reason == "completed"  # the server finished it; the listener heard the first second
    assert done.played_source == "client" and done.played_ms == 1000.0
    assert turn.result == sent
    _check_prefix(done.text_spoken, LONG_REPLY, _pcm(chunks)[:24_000], 24_000)


async def test_a_failing_text_stream_raises_from_the_turn_and_writes_nothing_to_stderr(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    async def llm() -> AsyncIterator[str]:
        yield "The model starts to answer, "
        raise RuntimeError("the LLM connection dropped")

    caplog.set_level("WARNING", logger="voicewire.client")  # what an app with no logging set up prints
    async with running_gateway(engine) as base, await VoicewireClient.connect(f"ws://{base}") as client:
        turn = client.speak(llm())
        with pytest.raises(RuntimeError, match="connection dropped"):
            await turn.done(timeout_s=10)
        await client.send_message({"type": "text.flush", "turn_id": "never-started"})
        await asyncio.sleep(0.2)
        assert [e.code for e in client.errors] == ["unknown_turn"]  # kept for the caller to read
    assert not [r for r in caplog.records if r.name.startswith("voicewire.client")]
