"""Where a new turn's time to first audio goes inside the engine, stage by stage.

    python3 benchmarks/turn_timeline.py --model null --out timeline_cpu.json        # host code only (CPU)
    python3 benchmarks/turn_timeline.py --size 1.7b --device cuda --out t.json      # on the lent GPU

The served engine runs in-process (no gateway, no core process: the front door's ``engine_ttfp_ms``
less this TTFP is the trip through them). Each turn's first pass through the worker is marked where
it happens: its open taken, its first frame step begun, that step's codes waited for and in, its
first chunk's codec work begun, its audio done, handed to the loop and delivered there. Two loads:
``lone`` turns one at a time with nothing else running (the floor), and an open-loop Poisson load at
``--rate`` with the committed length mix (a turn that lands while another stream steps); each for
the served engine and, on the same engine, without ``EngineConfig.quiet_rows`` (``noquiet``).
``--model null`` is Qwen3-TTS's host code with its device work short-circuited
(qwen3_null_device.py); ``--profile`` adds a cProfile of the lone turns' first begins, which it slows.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import pstats
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_load import Lengths, load_config, open_loop, pct

from voicewire.engine import engine, stream
from voicewire.engine.model import Queued, StreamParams

# stages in the order a turn passes them; each is the first time its stream is seen there
STAGES = (
    "taken",  # the worker handles its open
    "opened",  # its slot opened (prompt built, text queued)
    "step_begin",  # its first frame step planned, the model's begin called
    "step_begun",  # the step's work queued on the device
    "codes_wait",  # the worker starts its blocking wait for that step's codes (after a quiet step's looks)
    "codes",  # its codes on the host, recorded
    "codec_begin",  # its first chunk's codec work begun
    "codec_begun",
    "pcm",  # its audio taken from the device
    "emit",  # handed to the loop
    "delivered",  # on the loop, in the stream
)


class Timeline:
    """Per stream: seconds from its open to each stage, the first time it passes it."""

    def __init__(self) -> None:
        self.on = False
        self.prof: cProfile.Profile | None = None  # profiles the first steps' begins and first chunks' codec begins
        self.t_open: dict[int, float] = {}
        self.marks: dict[int, dict[str, float]] = defaultdict(dict)

    def mark(self, sids: Any, stage: str) -> None:
        if not self.on:
            return
        now = time.perf_counter()
        for sid in sids:
            if sid in self.t_open:
                self.marks[sid].setdefault(stage, now)

    def profiled(self, sids: Any, stage: str, fn: Any, *args: Any) -> Any:
        """``fn(*args)``, under the profile when this is the first time one of ``sids`` passes
        ``stage`` (its mark just made)."""
        marks = self.marks
        first = self.prof is not None and any(
            marks[s].get(stage) == max(marks[s].values()) for s in sids if s in marks
        )
        if not first:
            return fn(*args)
        assert self.prof is not None
        self.prof.enable()
        try:
            return fn(*args)
        finally:
            self.prof.disable()

    def install(self, eng: engine.Engine) -> None:
        tl = self
        open0, handle0, opened0 = eng._open_stream, eng._handle, eng._open
        emit0 = eng._emit

        def open_stream(params: StreamParams) -> stream.Stream:
            t = time.perf_counter()
            s = open0(params)
            if tl.on:
                tl.t_open[s.id] = t
            return s

        def handle(cmd: Any) -> None:
            if isinstance(cmd, engine.OpenStream):
                tl.mark((cmd.stream.id,), "taken")
            handle0(cmd)

        def opened(s: stream.Stream, params: StreamParams) -> None:
            opened0(s, params)
            tl.mark((s.id,), "opened")

        def emit(live: Any, decoded: Any, final: bool, text: str) -> None:
            emit0(live, decoded, final, text)
            tl.mark((live.stream.id,), "emit")

        eng._open_stream, eng._handle, eng._open, eng._emit = open_stream, handle, opened, emit  # type: ignore[method-assign]

        stage = eng._stepping
        begin0, finish0 = stage.begin, stage.finish

        def begin(model: Any, slots: Any, plan: Any) -> bool:
            tl.mark(plan.generate_streams, "step_begin")
            ok = tl.profiled(plan.generate_streams, "step_begin", begin0, model, slots, plan)
            tl.mark(plan.generate_streams, "step_begun")
            return ok

        def finish(slots: Any) -> None:
            plan = stage._steps[0][0]
            tl.mark(plan.generate_streams, "codes_wait")
            finish0(slots)
            tl.mark(plan.generate_streams, "codes")

        stage.begin, stage.finish = begin, finish  # type: ignore[method-assign]

        codec = eng._codec
        piece0, hand0 = codec._begin_piece, codec._hand_out

        def begin_piece(model: Any, due: list[Any], urgent: bool) -> None:
            sids = [d.stream_id for d in due]
            tl.mark(sids, "codec_begin")
            tl.profiled(sids, "codec_begin", piece0, model, due, urgent)
            tl.mark(sids, "codec_begun")

        def hand_out(piece: Any) -> None:
            sids = [d.stream_id for d in piece.due]

            def wait() -> Any:
                pcm = piece.finish()
                tl.mark(sids, "pcm")
                return pcm

            hand0(piece._replace(finish=Queued(wait)))

        codec._begin_piece, codec._hand_out = begin_piece, hand_out  # type: ignore[method-assign]
        codec.work._hand_out = hand_out

        deliver0 = stream.Stream.deliver

        def deliver(s: stream.Stream, chunk: Any) -> None:
            tl.mark((s.id,), "delivered")
            deliver0(s, chunk)

        stream.Stream.deliver = deliver  # type: ignore[method-assign]

    def summary(self) -> dict[str, Any]:
        """Each stage's offset from the open (p50 / p95 / max ms) and each step between two stages."""
        rows = [
            {k: (t - self.t_open[sid]) * 1e3 for k, t in m.items()}
            for sid, m in self.marks.items()
            if "delivered" in m
        ]
        out: dict[str, Any] = {"turns": len(rows), "at_ms": {}, "step_ms": {}}
        prev = None
        for st in STAGES:
            xs = [r[st] for r in rows if st in r]
            if xs:
                out["at_ms"][st] = {"p50": pct(xs, 50), "p95": pct(xs, 95), "max": max(xs), "n": len(xs)}
            if prev is not None:
                d = [r[st] - r[prev] for r in rows if st in r and prev in r]
                if d:
                    out["step_ms"][f"{prev}->{st}"] = {"p50": pct(d, 50), "p95": pct(d, 95), "max": max(d)}
            prev = st
        return out

    def reset(self) -> None:
        self.t_open.clear()
        self.marks.clear()


async def lone(
    eng: engine.Engine, tl: Timeline, turns: int, gap_s: float, frames: int, prof: cProfile.Profile | None = None
) -> dict[str, Any]:
    tl.reset()
    tl.on = True
    tl.prof = prof
    for i in range(turns):
        await asyncio.sleep(gap_s)
        s = eng.open_stream(StreamParams(forced_frames=frames, seed=i + 1))
        s.push_text("The quick brown fox jumps over the lazy dog near the river bank today.")
        s.end()
        async for _ in s:
            pass
    tl.on = False
    tl.prof = None
    return tl.summary()


def top_functions(prof: cProfile.Profile, n: int = 40) -> list[str]:
    """The profiled calls' functions by cumulative time, as pstats prints them."""
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(n)
    return buf.getvalue().splitlines()


async def poisson(eng: engine.Engine, tl: Timeline, rate: float, duration_s: float) -> dict[str, Any]:
    tl.reset()
    tl.on = True
    load = await open_loop(eng, rate, duration_s, Lengths(), 7)
    tl.on = False
    load.pop("arrivals", None)
    return {"timeline": tl.summary(), "ttfp_ms_p50": load.get("ttfp_ms_p50"), "ttfp_ms_p95": load.get("ttfp_ms_p95")}


def build_engine(args: argparse.Namespace) -> engine.Engine:
    if args.model == "null":
        from qwen3_null_device import null_device_qwen3

        model: Any = null_device_qwen3(args.max_slots, args.max_batch)
    else:
        from serving_bench import build

        model = build(args, codec_graph_frames=48)
    return engine.Engine(load_config("qwen3", args.max_slots), model)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("qwen3", "null"), default="qwen3")
    ap.add_argument("--size", default="1.7b")
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--max-batch", type=int, default=512)  # realtime/engine_flags.py CUDA_MAX_BATCH
    ap.add_argument("--max-slots", type=int, default=512)
    ap.add_argument("--max-seq-len", type=int, default=512)
    ap.add_argument("--turns", type=int, default=40)
    ap.add_argument("--gap-s", type=float, default=0.1, help="between lone turns")
    ap.add_argument("--lone-frames", type=int, default=8, help="each lone turn's length")
    ap.add_argument("--rate", type=float, default=1.0, help="the Poisson load's turns a second")
    ap.add_argument("--duration-s", type=float, default=30.0)
    ap.add_argument("--variants", default="served,noquiet", help="served, noquiet (see run())")
    ap.add_argument("--profile", action="store_true", help="cProfile the lone turns' first begins")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    t0 = time.perf_counter()
    eng = build_engine(args)
    tl = Timeline()
    res: dict[str, Any] = {"command": " ".join(sys.argv)}

    async def run() -> None:
        await asyncio.get_running_loop().run_in_executor(None, eng.start)
        tl.install(eng)
        res["ready_s"] = time.perf_counter() - t0
        await lone(eng, tl, 5, args.gap_s, args.lone_frames)  # a few first: the figures are of a warm path
        served_rows = eng._scheduler._wait_rows
        for variant in args.variants.split(","):
            # "noquiet": EngineConfig.quiet_rows 0 on the same engine (a first chunk's codec work runs
            # beside the next frame step; a new turn waits for the step running when it comes)
            rows = 0 if variant == "noquiet" else served_rows
            eng._scheduler._wait_rows = eng._stepping.quiet_rows = rows
            prof = cProfile.Profile() if args.profile else None
            res[variant] = {"lone": await lone(eng, tl, args.turns, args.gap_s, args.lone_frames, prof)}
            print(variant, json.dumps(res[variant]["lone"]["step_ms"]), flush=True)
            if prof is not None:
                res[variant]["lone_profile"] = top_functions(prof)
            res[variant]["poisson"] = await poisson(eng, tl, args.rate, args.duration_s)
            print(variant, json.dumps(res[variant]["poisson"]), flush=True)

    try:
        asyncio.run(run())
    finally:
        eng.close()
    Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
