"""A load the engine runs through itself before it says ready, so the first real load after
``/readyz`` meets a process as warm as the tenth.

Graph capture runs every bucket's body once, but serving takes more than the bodies: the worker's
own paths (admission waves, prefill batches of every size, decode buckets as streams end at
different lengths, chunks of the whole ladder, streamed text word by word, cancels mid-stream), the
pinned host buffers and allocator blocks a full batch needs, and the Python objects every turn
makes. In a Poisson draw of streamed turns at 200/s on an H200, a just-ready server that had run
none of it refused 139 turns and underran 92; one that had spoken 13 turns first, 0 and 3. This drives ``streams`` streams through
the public stream API in waves of 1, 2, 4 ... streams, with lengths spread over 4 to 60 frames, half
of them fed a word at a time, one in eight cancelled after its first chunk; the engine's
``ready`` stays false until it is done (or ``TIMEOUT_S`` has passed).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from .model import StreamParams
from .stream import Stream, StreamError

log = logging.getLogger("voicewire.engine")

TEXT = "Every path a turn takes runs once before the first listener arrives."
MIN_FRAMES, MAX_FRAMES = 4, 60  # 0.3 to 4.8 s of Qwen3-TTS audio: the chunk ladder up to its long chunks
CANCEL_EVERY = 8
WORD_GAP_S = 0.01  # between a streamed turn's words: text that arrives while its stream speaks
TIMEOUT_S = 60.0


def run(open_stream: Callable[[StreamParams], Stream], streams: int) -> float:
    """Drive the warm load on a loop of its own; returns its seconds. An engine started from a
    coroutine (its caller's loop is running here) runs it on a thread of its own."""
    if streams <= 0:
        return 0.0
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _run(open_stream, streams)
    with ThreadPoolExecutor(1, thread_name_prefix="voicewire-warm-load") as pool:
        return pool.submit(_run, open_stream, streams).result()


def _run(open_stream: Callable[[StreamParams], Stream], streams: int) -> float:
    t0 = time.perf_counter()
    try:
        asyncio.run(asyncio.wait_for(_waves(open_stream, streams), TIMEOUT_S))
    except (TimeoutError, StreamError) as err:  # ready anyway: a cold path is slower, not wrong
        log.warning("warm load stopped early after %.1f s: %r", time.perf_counter() - t0, err)
    seconds = time.perf_counter() - t0
    log.info("warm load: %d streams in %.1f s", streams, seconds)
    return seconds


async def _waves(open_stream: Callable[[StreamParams], Stream], streams: int) -> None:
    tasks: list[asyncio.Task[None]] = []
    opened, wave = 0, 1
    while opened < streams:
        for _ in range(min(wave, streams - opened)):
            span = MAX_FRAMES - MIN_FRAMES
            frames = MIN_FRAMES + (opened * 37) % (span + 1)  # spread, and the same every start
            params = StreamParams(forced_frames=frames, seed=opened, greedy=True)
            tasks.append(asyncio.create_task(_turn(open_stream(params), opened)))
            opened += 1
        wave *= 2
        await asyncio.sleep(0.02)  # the next wave opens beside streams already speaking
    await asyncio.gather(*tasks)


async def _turn(stream: Stream, n: int) -> None:
    if n % 2:
        for word in TEXT.split():
            stream.push_text(word + " ")
            await asyncio.sleep(WORD_GAP_S)
    else:
        stream.push_text(TEXT)
    stream.end()
    async for _ in stream:
        if n % CANCEL_EVERY == CANCEL_EVERY - 1:
            stream.cancel()
            break
