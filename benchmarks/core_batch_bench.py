"""What a chunk costs at the engine-core boundary when a loop pass's chunks go as one multipart message
(engine/core/outgoing.py) against one message a chunk: the CPU time of the sending loop (the core's,
which shares its interpreter lock with the frame-stepping worker) and of the receiving loop (the
gateway's), each in its own process, with the real wire format and socket setup.

Each pass of the sender's loop puts ``--streams`` chunks (a tick's codec work handing out a chunk to
each of its streams) of ``--frames`` Qwen3-TTS frames each, as the core's forwarders do.

    python benchmarks/core_batch_bench.py --out benchmarks/results/core_batch_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import subprocess
import tempfile
import time
from typing import Any

import numpy as np
import zmq
import zmq.asyncio
from ws_bench import write_results

from voicewire.engine import AudioChunk
from voicewire.engine.core.messages import Audio, decode_all_from_core, encode_from_core
from voicewire.engine.core.outgoing import Outgoing, sender

FRAME_SAMPLES = 1920


def _socket(ctx: zmq.asyncio.Context, kind: int) -> zmq.asyncio.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    return sock


async def _send(address: str, batched: bool, streams: int, passes: int, frames: int) -> float:
    """The core's side: CPU seconds a chunk."""
    ctx = zmq.asyncio.Context()
    push = _socket(ctx, zmq.PUSH)
    push.connect(address)
    out = Outgoing(sender(push))
    chunk = AudioChunk(np.zeros(frames * FRAME_SAMPLES, np.float32), 24_000, 0, text="a word")
    cpu0 = time.thread_time()
    for _ in range(passes):
        for sid in range(streams):
            frames_out = encode_from_core(Audio(sid, chunk, 0))
            if batched:
                out.put(frames_out)
            else:
                await push.send_multipart(frames_out, copy=False)
        await asyncio.sleep(0)  # the pass ends: the batch goes
    cpu = time.thread_time() - cpu0
    await asyncio.sleep(0.5)  # linger: the receiver takes the rest
    push.close(linger=1000)
    ctx.term()
    return cpu / (streams * passes)


def _sender(address: str, batched: bool, streams: int, passes: int, frames: int, result: Any) -> None:
    result.put(asyncio.run(_send(address, batched, streams, passes, frames)))


async def _receive(pull: zmq.asyncio.Socket, chunks: int) -> float:
    """The gateway's side: CPU seconds a chunk (receive and decode)."""
    got, cpu0 = 0, None
    while got < chunks:
        messages = decode_all_from_core(await pull.recv_multipart())
        if cpu0 is None:
            cpu0 = time.thread_time()
        got += len(messages)
    assert cpu0 is not None
    return (time.thread_time() - cpu0) / chunks


async def run(args: argparse.Namespace) -> dict[str, Any]:
    spawn = multiprocessing.get_context("spawn")
    out: dict[str, Any] = {"streams_a_pass": args.streams, "frames_a_chunk": args.frames, "rounds": []}
    for r in range(args.rounds):
        for batched in (False, True):
            address = f"ipc://{tempfile.mkdtemp(prefix='voicewire-batch-')}/s"
            ctx = zmq.asyncio.Context()
            pull = _socket(ctx, zmq.PULL)
            pull.bind(address)
            result = spawn.Queue()
            proc = spawn.Process(
                target=_sender, args=(address, batched, args.streams, args.passes, args.frames, result)
            )
            proc.start()
            recv_s = await _receive(pull, args.streams * args.passes)
            send_s = result.get(timeout=60)
            proc.join(10)
            pull.close(linger=0)
            ctx.term()
            row = {"round": r, "batched": batched, "send_us": send_s * 1e6, "receive_us": recv_s * 1e6}
            print(f"round {r} {'batched' if batched else 'one a chunk'}: send {row['send_us']:.1f} us, "
                  f"receive {row['receive_us']:.1f} us a chunk", flush=True)  # fmt: skip
            out["rounds"].append(row)
    for batched in (False, True):
        rows = [x for x in out["rounds"] if x["batched"] is batched]
        out["batched" if batched else "one_a_chunk"] = {
            k: round(statistics.median(x[k] for x in rows), 1) for k in ("send_us", "receive_us")
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=48, help="chunks a pass of the sender's loop")
    ap.add_argument("--passes", type=int, default=400)
    ap.add_argument("--frames", type=int, default=4, help="Qwen3-TTS frames a chunk")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    results = asyncio.run(run(args))
    git = ["git", "rev-parse", "--short", "HEAD"]
    results["commit"] = subprocess.run(git, capture_output=True, text=True).stdout.strip() or "unknown"
    write_results(results, args.out)


if __name__ == "__main__":
    main()
