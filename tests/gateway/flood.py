"""One heavy client, in a process of its own: sessions, speech requests and uploads at once.

    python -m tests.gateway.flood URL --sessions 300 --speech 100 --uploads 50 --duration-s 8
    python -m tests.gateway.flood URL --deltas-from 127.0.0.3 --deltas-from 127.0.0.4 ...

Every accepted session keeps its open turns full of long replies, read as fast as they come;
every speech request reads its whole answer and is sent again; uploads post a real WAV. All from
one address (``--local-addr``), for ``--duration-s`` seconds, then it prints one JSON line: how
many of each were accepted and refused, by code. Its own process, so the server's loop and the
victim's are not the flood's.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import io
import json
import time
from typing import Any

import aiohttp
import numpy as np

from voicewire.realtime.client import VoicewireClient, VoicewireError

REPLY = " ".join(["The heavy client asks for one more long reply, and then another one after it."] * 4)


def _wav() -> bytes:
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="wav") as out:
        stream = out.add_stream("pcm_s16le", rate=16_000, layout="mono")
        t = np.arange(16_000 * 3) / 16_000
        pcm = (0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2")[None, :]
        frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout="mono")
        frame.sample_rate = 16_000
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


async def _session(
    url: str, local: tuple[str, int], counts: collections.Counter[str], stop: float, turns: int
) -> None:
    try:
        client = await VoicewireClient.connect(url, local_addr=local, timeout_s=20)
    except VoicewireError as err:
        counts[f"session:{err.code}"] += 1
        return
    except Exception as err:
        counts[f"session:{type(err).__name__}"] += 1
        return
    counts["session:accepted"] += 1

    async def keep_speaking() -> None:
        while time.monotonic() < stop:
            turn = client.speak([REPLY])
            try:
                done = await turn.done(timeout_s=max(0.1, stop - time.monotonic()))
                counts[f"turn:{done.reason}"] += 1
                if done.reason == "error":
                    await asyncio.sleep(0.05)
            except TimeoutError:
                return
            except VoicewireError as err:
                counts[f"turn:{err.code}"] += 1
                await asyncio.sleep(0.05)

    try:
        await asyncio.gather(*(keep_speaking() for _ in range(turns)), return_exceptions=True)
    finally:
        await client.close()


async def _deltas(url: str, local: tuple[str, int], counts: collections.Counter[str], stop: float) -> None:
    """One session that sends a one-word delta every millisecond, turn after turn."""
    async with await VoicewireClient.connect(url, local_addr=local, timeout_s=20) as client:
        counts["deltas:session"] += 1
        while time.monotonic() < stop:
            turn = await client.start_turn()
            for _ in range(2000):
                if time.monotonic() >= stop or turn.result is not None:
                    break
                await turn.send("w")
                counts["deltas:sent"] += 1
                await asyncio.sleep(0.001)
            with contextlib.suppress(VoicewireError, TimeoutError):
                await turn.cancel(timeout_s=2)


async def _speech(
    http: aiohttp.ClientSession, url: str, counts: collections.Counter[str], stop: float
) -> None:
    while time.monotonic() < stop:
        try:
            async with http.post(
                f"{url}/v1/audio/speech", json={"input": REPLY, "response_format": "pcm"}
            ) as r:
                if r.status == 200:
                    await r.read()
                    counts["speech:200"] += 1
                else:
                    counts[f"speech:{(await r.json())['error']['code']}"] += 1
                    await asyncio.sleep(0.05)
        except (aiohttp.ClientError, TimeoutError) as err:
            counts[f"speech:{type(err).__name__}"] += 1


async def _upload(
    http: aiohttp.ClientSession, url: str, wav: bytes, counts: collections.Counter[str], stop: float
) -> None:
    i = 0
    while time.monotonic() < stop:
        form = aiohttp.FormData()
        form.add_field("name", f"flood-{id(counts)}-{i}")
        form.add_field("audio", wav, filename="ref.wav", content_type="audio/wav")
        i += 1
        try:
            async with http.post(f"{url}/v1/audio/voices", data=form) as r:
                body = await r.json()
                counts[f"upload:{r.status if r.status < 400 else body['error']['code']}"] += 1
        except (aiohttp.ClientError, TimeoutError) as err:
            counts[f"upload:{type(err).__name__}"] += 1
        await asyncio.sleep(0.05)


async def flood(
    url: str,
    sessions: int,
    speech: int,
    uploads: int,
    duration_s: float,
    local_addr: str,
    turns: int,
    deltas: tuple[str, ...] = (),
) -> dict[str, Any]:
    counts: collections.Counter[str] = collections.Counter()
    stop = time.monotonic() + duration_s
    local = (local_addr, 0)
    wav = _wav()
    connector = aiohttp.TCPConnector(local_addr=local, limit=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=duration_s + 10)
    ) as http:
        tasks = [_session(url, local, counts, stop, turns) for _ in range(sessions)]
        tasks += [_speech(http, url, counts, stop) for _ in range(speech)]
        tasks += [_upload(http, url, wav, counts, stop) for _ in range(uploads)]
        tasks += [_deltas(url, (address, 0), counts, stop) for address in deltas]
        await asyncio.gather(*tasks, return_exceptions=True)
    return dict(counts)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--sessions", type=int, default=0)
    parser.add_argument("--turns", type=int, default=4, help="turns each session keeps open")
    parser.add_argument("--speech", type=int, default=0)
    parser.add_argument("--uploads", type=int, default=0)
    parser.add_argument("--duration-s", type=float, default=8.0)
    parser.add_argument("--local-addr", default="127.0.0.1")
    parser.add_argument(
        "--deltas-from",
        action="append",
        default=[],
        help="a session from this address sends a delta every ms",
    )
    args = parser.parse_args()
    counts = asyncio.run(
        flood(
            args.url,
            args.sessions,
            args.speech,
            args.uploads,
            args.duration_s,
            args.local_addr,
            args.turns,
            tuple(args.deltas_from),
        )
    )
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
