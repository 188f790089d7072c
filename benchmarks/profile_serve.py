"""Where a loaded engine's time goes: each tick's host phases and the GPU span of every graph call.

    python3 benchmarks/profile_serve.py --size 1.7b --rate 170 --out p.json     # on the lent H200

The served engine (1.7B, random weights, 512 slots, batch 256, the committed length mix) takes an
open-loop Poisson load for ``--duration-s``. Every graph replay is bracketed by CUDA events on the
stream it runs on (the frame step and prefill on the worker's stream, the codec on its own), so the
JSON holds, per call kind, how long it ran on the GPU under load (which counts the slowdown of
sharing the SMs with the other stream), and per tick: the host time of each phase (plan, the frame
step's launches, the wait for its codes, the codec's launches, the wait for its PCM, hand-off),
batch sizes, new streams prefilled, codec calls with their shapes, and what holds the slots (live
streams, those done but still decoding, frames awaiting the codec). Also: the decode graph and each
codec graph alone and both at once on two streams (``contention``), the allocator's state and its
cache retries around each run, the codec graph's kernels by name (torch.profiler over replays), and
each of its convolutions timed alone in the served layout against channels-last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_load import Lengths, closed_loop, load_config, open_loop, pct
from serving_bench import build, env, gpu_ms, kernels_by_name

from voicewire.engine.config import ChunkSchedule
from voicewire.engine.engine import Engine
from voicewire.engine.model import Queued
from voicewire.engine.qwen3 import ExperimentalOptions, Qwen3TTSModel
from voicewire.engine.qwen3.host_staging import PinnedBlocks, Staging

# the served frame step's rows on CUDA (realtime/engine_flags.py CUDA_MAX_BATCH: that module needs the
# gateway's packages, which the device has only where they are carried)
SERVED_MAX_BATCH = 512

VARIANTS: dict[str, dict[str, Any]] = {
    "served": {},
    "serial": {"overlap_decode": False},  # the codec after the frame step, on the worker's stream
    "noahead": {"queue_ahead": False},  # no frame step queued behind the running one
    "noramp": {"chunks": ChunkSchedule(ramp_frames=())},  # 1, then 12-frame chunks
    "steady24": {"chunks": ChunkSchedule(ramp_frames=(2, 4, 8, 12), steady_frames=24)},
}


# --- the codec's kernels and convolutions -----------------------------------------------------------
def codec_kernels(model: Qwen3TTSModel, shapes: list[tuple[int, int]]) -> dict[str, Any]:
    q, dev, out = model.cfg.talker.num_code_groups, model.device, {}
    rng = np.random.default_rng(0)
    for b, t in shapes:
        if not model.graphs.has(("codec", b, t)):
            continue
        rows = rng.integers(0, 2048, (b, q * t + 2)).astype(np.int64)
        rows[:, -2], rows[:, -1] = t, np.arange(b)
        replay = lambda rows=rows, b=b, t=t: model.graphs.run(("codec", b, t), rows)  # noqa: E731
        row: dict[str, Any] = {"graph_ms": gpu_ms(replay, dev, 10)}
        row.update(kernels_by_name(replay, dev))
        out[f"B{b}_T{t}"] = row
    return out


def conv_layouts(model: Qwen3TTSModel, b: int, t: int) -> dict[str, Any]:
    """Each conv of one eager (b, t) codec call, timed alone: as served (N, C, T) against channels-last
    conv2d (N, C, 1, T) in NHWC memory, and a 1x1 conv as a (N T, C) matmul."""
    codec, dev = model.codec, model.device
    seen: list[tuple[str, torch.nn.Module, tuple[int, ...]]] = []
    hooks = []
    for name, m in codec.named_modules():
        if isinstance(m, torch.nn.Conv1d | torch.nn.ConvTranspose1d):
            hooks.append(
                m.register_forward_hook(lambda mod, inp, _o, name=name: seen.append((name, mod, tuple(inp[0].shape))))
            )
    q = model.cfg.talker.num_code_groups
    codes = torch.randint(0, 2048, (b, q, t), device=dev)
    state, start = codec.fresh_state(b)
    with torch.no_grad():
        codec.stream(codes, state, start)
    for h in hooks:
        h.remove()
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    torch.backends.cudnn.benchmark = True
    for name, mod, shape in seen:
        transposed = isinstance(mod, torch.nn.ConvTranspose1d)
        key = (transposed, shape, tuple(mod.weight.shape), mod.stride, mod.dilation, mod.groups)
        if key in groups:
            groups[key]["count"] += 1
            continue
        x = torch.randn(shape, device=dev, dtype=mod.weight.dtype)
        w, bias = mod.weight, mod.bias
        with torch.no_grad():
            if transposed:
                ncw = lambda x=x, mod=mod: mod(x)  # noqa: E731
                x4 = x[:, :, None].contiguous(memory_format=torch.channels_last)
                w4 = w[:, :, None].contiguous(memory_format=torch.channels_last)
                nhwc = lambda x4=x4, w4=w4, mod=mod, bias=bias: F.conv_transpose2d(  # noqa: E731
                    x4, w4, bias, stride=(1, mod.stride[0])
                )
            else:
                ncw = lambda x=x, mod=mod: mod(x)  # noqa: E731
                x4 = x[:, :, None].contiguous(memory_format=torch.channels_last)
                w4 = w[:, :, None].contiguous(memory_format=torch.channels_last)
                nhwc = lambda x4=x4, w4=w4, mod=mod, bias=bias: F.conv2d(  # noqa: E731
                    x4, w4, bias, dilation=(1, mod.dilation[0]), groups=mod.groups
                )
            row = {"layer": name, "count": 1, "in": list(shape), "weight": list(w.shape)}
            row["kernel"], row["dilation"], row["stride"] = w.shape[-1], mod.dilation[0], mod.stride[0]
            row["ncw_ms"] = gpu_ms(ncw, dev, 10)
            row["nhwc_ms"] = gpu_ms(nhwc, dev, 10)
            if not transposed and w.shape[-1] == 1 and mod.groups == 1:
                xt = x.transpose(1, 2).contiguous()
                w2 = w[:, :, 0].T.contiguous()
                row["matmul_ms"] = gpu_ms(lambda xt=xt, w2=w2: xt @ w2, dev, 10)
        groups[key] = row
    rows = sorted(groups.values(), key=lambda r: -r["ncw_ms"] * r["count"])
    total = {k: sum(r[k] * r["count"] for r in rows) for k in ("ncw_ms", "nhwc_ms")}
    return {"b": b, "t": t, "convs": len(seen), "total_ms": total, "layers": rows}


# --- the device's memory and the two streams side by side ------------------------------------------
MEMORY_COUNTERS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free")


def memory(dev: torch.device) -> dict[str, Any]:
    """What the caching allocator holds and how often it had to free its cache to allocate (a retry
    synchronizes the device: near a full device every step would wait for the other stream)."""
    if dev.type != "cuda":
        return {}
    free, total = torch.cuda.mem_get_info(dev)
    stats = torch.cuda.memory_stats(dev)
    gib = float(1 << 30)
    return {
        "free_gib": free / gib,
        "total_gib": total / gib,
        "allocated_gib": torch.cuda.memory_allocated(dev) / gib,
        "reserved_gib": torch.cuda.memory_reserved(dev) / gib,
        **{k: int(stats.get(k, 0)) for k in MEMORY_COUNTERS},
    }


def _bracketed(fn: Callable[[], Any], stream: Any, n: int) -> list[tuple[Any, Any]]:
    """n calls of fn queued on ``stream``, each between two events."""
    out = []
    for _ in range(n):
        e0, e1 = _event(), _event()
        e0.record(stream)
        fn()
        e1.record(stream)
        out.append((e0, e1))
    return out


def contention(model: Qwen3TTSModel, decode_rows: int, shapes: list[tuple[int, int]], calls: int = 6) -> dict[str, Any]:
    """The frame step's decode graph and a codec graph, each alone and both at once on their two streams
    (the codec on its own stream, and on a high- and a low-priority one): how much each slows the other.
    A codec call far slower beside the frame step than alone is what an overlapped engine pays per tick."""
    graphs, dev, q = model.graphs, model.device, model.cfg.talker.num_code_groups
    if dev.type != "cuda" or not graphs.has(("decode", decode_rows)):
        return {}
    staging = Staging(PinnedBlocks(), dev)
    dec_rows = np.full(decode_rows, model.pad_slot, np.int64)
    main = torch.cuda.current_stream(dev)
    least, greatest = torch.cuda.Stream.priority_range() if hasattr(torch.cuda.Stream, "priority_range") else (0, -1)
    streams = {
        "codec_stream": model.codec_runner.stream,
        "high_priority": torch.cuda.Stream(dev, priority=greatest),
        "low_priority": torch.cuda.Stream(dev, priority=least),
    }

    def decode() -> None:
        graphs.run(("decode", decode_rows), dec_rows, staging)

    out: dict[str, Any] = {"decode_rows": decode_rows, "decode_alone_ms": gpu_ms(decode, dev, 10)}
    rng = np.random.default_rng(0)
    for b, t in shapes:
        if not graphs.has(("codec", b, t)):
            continue
        rows = rng.integers(0, 2048, (b, q * t + 2)).astype(np.int64)
        rows[:, -2], rows[:, -1] = t, np.arange(b)
        codec = lambda rows=rows, b=b, t=t: graphs.run(("codec", b, t), rows, staging)  # noqa: E731
        with torch.cuda.stream(streams["codec_stream"]):
            alone = gpu_ms(codec, dev, 5)
        row: dict[str, Any] = {"codec_alone_ms": alone}
        n_decode = max(1, round(calls * alone / out["decode_alone_ms"]))
        for name, stream in streams.items():
            assert stream is not None
            torch.cuda.synchronize(dev)
            spans: dict[str, list[tuple[Any, Any]]] = {}
            origin = _event()
            origin.record(main)
            stream.wait_stream(main)
            with torch.cuda.stream(stream):
                spans["codec"] = _bracketed(codec, stream, calls)
            spans["decode"] = _bracketed(decode, main, n_decode)
            torch.cuda.synchronize(dev)
            row[name] = {
                "codec_ms": float(np.mean([a.elapsed_time(b) for a, b in spans["codec"]])),
                "decode_ms": float(np.mean([a.elapsed_time(b) for a, b in spans["decode"]])),
                "decode_calls": n_decode,
                "wall_ms": max(origin.elapsed_time(s[-1][1]) for s in spans.values()),
                "serial_ms": calls * alone + n_decode * out["decode_alone_ms"],
            }
        staging.release()  # after the synchronize: every copy from it done
        out[f"B{b}_T{t}"] = row
    return out


# --- the engine under load, traced ------------------------------------------------------------------
class _HostEvent:
    """torch.cuda.Event's timing calls on the host clock: the CPU smoke run of this script."""

    def __init__(self, enable_timing: bool = True) -> None:
        self.t = 0.0

    def record(self, stream: Any = None) -> None:
        self.t = time.perf_counter()

    def elapsed_time(self, other: _HostEvent) -> float:
        return (other.t - self.t) * 1e3


def _event() -> Any:
    return torch.cuda.Event(enable_timing=True) if torch.cuda.is_available() else _HostEvent()


class Tracer:
    """Wraps one engine's worker phases and its model's graph replays; everything on the worker thread."""

    def __init__(self, engine: Engine, model: Qwen3TTSModel) -> None:
        self.ticks: list[dict[str, Any]] = []
        self.spans: list[tuple[str, Any, torch.cuda.Event, torch.cuda.Event]] = []
        self.base = _event()
        self.base.record()
        self.tick: dict[str, Any] = {}
        self.on = False
        graphs, runner = model.graphs, model.codec_runner

        def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(*a: Any, **k: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    self.tick[name] = self.tick.get(name, 0.0) + (time.perf_counter() - t0) * 1e3

            return wrapper

        run = graphs.run

        def graph_run(key: Any, rows: np.ndarray, staging: Any = None) -> Any:
            if not self.on:
                return run(key, rows, staging)
            s = torch.cuda.current_stream() if torch.cuda.is_available() else None
            e0, e1 = _event(), _event()
            e0.record(s)
            out = run(key, rows, staging)
            e1.record(s)
            self.spans.append((key[0], key[1:], e0, e1))
            self.tick.setdefault("graphs", []).append(key)
            return out

        graphs.run = graph_run  # type: ignore[method-assign]
        gen_start, to_host = model.generate_start, model.codes_to_host.start

        def generate_start(slots: Any) -> Any:
            results = timed("generate_launch_ms", gen_start)(slots)
            return Queued(timed("generate_finish_ms", results), results.done)

        def codes(x: Any) -> Any:
            copied = to_host(x)
            return Queued(timed("codes_wait_ms", copied), copied.done)

        model.generate_start = generate_start  # type: ignore[method-assign]
        model.codes_to_host.start = codes  # type: ignore[method-assign]
        start = runner.decode_start

        def decode_start(work: Any, urgent: bool = False) -> Any:
            t0 = time.perf_counter()
            finish = start(work, urgent)
            self.tick["codec_launch_ms"] = self.tick.get("codec_launch_ms", 0.0) + (time.perf_counter() - t0) * 1e3
            self.tick["codec_chunks"] = self.tick.get("codec_chunks", 0) + len(work)
            self.tick["codec_frames"] = self.tick.get("codec_frames", 0) + sum(w.n_frames for w in work)
            return Queued(timed("pcm_wait_ms", finish), finish.done)

        runner.decode_start = decode_start  # type: ignore[method-assign]
        sched = engine._scheduler
        sched.plan_generate = timed("plan_generate_ms", sched.plan_generate)  # type: ignore[method-assign]
        sched.plan_decode = timed("plan_decode_ms", sched.plan_decode)  # type: ignore[method-assign]
        engine._emit = timed("emit_ms", engine._emit)  # type: ignore[method-assign]
        engine._drain = timed("drain_ms", engine._drain)  # type: ignore[method-assign]
        handle = engine._handle

        def handle_command(cmd: Any) -> None:  # the drain split by command, and its count
            self.tick["commands"] = self.tick.get("commands", 0) + 1
            timed(f"drain_{type(cmd).__name__}_ms", handle)(cmd)

        engine._handle = handle_command  # type: ignore[method-assign]
        model.open_slot = timed("open_slot_ms", model.open_slot)  # type: ignore[method-assign]
        model.add_text = timed("add_text_ms", model.add_text)  # type: ignore[method-assign]
        engine._ready = timed("ready_ms", engine._ready)  # type: ignore[method-assign]
        step = engine._step

        def tick(ready: set[int]) -> None:
            t0 = time.perf_counter()
            step(ready)
            if self.on:
                self.tick["tick_ms"] = (time.perf_counter() - t0) * 1e3
                self.tick["t"] = t0
                self.tick["ready"] = len(ready)
                # what holds the slots: streams still generating, and those done but with audio left
                # to decode (their slot stays taken until the last chunk is out)
                reqs = sched.requests.values()
                self.tick["live"] = len(engine._live)
                self.tick["done_undecoded"] = sum(r.generation_done and not r.final_sent for r in reqs)
                self.tick["pending_frames"] = sum(r.pending_frames for r in reqs)
                self.ticks.append(self.tick)
            self.tick = {}

        engine._step = tick  # type: ignore[method-assign]

    def summary(self) -> dict[str, Any]:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        spans = [(kind, shape, self.base.elapsed_time(a), self.base.elapsed_time(b)) for kind, shape, a, b in self.spans]
        out: dict[str, Any] = {"ticks": len(self.ticks)}
        if not self.ticks:
            return out
        wall = (self.ticks[-1]["t"] - self.ticks[0]["t"]) * 1e3 + self.ticks[-1]["tick_ms"]
        out["wall_ms"] = wall
        keys = sorted({k for t in self.ticks for k, v in t.items() if k.endswith("_ms")})
        out["host_ms_per_tick"] = {k: float(np.mean([t.get(k, 0.0) for t in self.ticks])) for k in keys}
        out["host_ms_total"] = {k: float(np.sum([t.get(k, 0.0) for t in self.ticks])) for k in keys}
        out["codec_frames_per_tick"] = float(np.mean([t.get("codec_frames", 0) for t in self.ticks]))
        per_kind: dict[str, list[float]] = defaultdict(list)
        by_shape: dict[str, list[float]] = defaultdict(list)
        for kind, shape, a, b in spans:
            per_kind[kind].append(b - a)
            by_shape[f"{kind}{list(shape)}"].append(b - a)
        out["gpu_ms"] = {
            k: {"calls": len(v), "total": float(np.sum(v)), "mean": float(np.mean(v)), "p90": pct(v, 90)}
            for k, v in per_kind.items()
        }
        out["gpu_ms_by_shape"] = {
            k: {"calls": len(v), "mean": float(np.mean(v)), "total": float(np.sum(v))}
            for k, v in sorted(by_shape.items(), key=lambda kv: -sum(kv[1]))[:40]
        }
        calls = Counter(len([g for g in t.get("graphs", []) if g[0] == "codec"]) for t in self.ticks)
        out["codec_calls_per_tick"] = dict(sorted(calls.items()))
        prefills = Counter(len([g for g in t.get("graphs", []) if g[0] == "prefill"]) for t in self.ticks)
        out["prefill_calls_per_tick"] = dict(sorted(prefills.items()))

        # busy time of each stream and of both at once, from the spans' union
        def union(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
            merged: list[list[float]] = []
            for a, b in sorted(iv):
                if merged and a <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], b)
                else:
                    merged.append([a, b])
            return [(a, b) for a, b in merged]

        main = union([(a, b) for k, _s, a, b in spans if k != "codec"])
        codec = union([(a, b) for k, _s, a, b in spans if k == "codec"])
        lo = min(a for _k, _s, a, _b in spans)
        hi = max(b for _k, _s, _a, b in spans)
        both, i, j = 0.0, 0, 0
        while i < len(main) and j < len(codec):
            a, b = max(main[i][0], codec[j][0]), min(main[i][1], codec[j][1])
            both += max(0.0, b - a)
            if main[i][1] < codec[j][1]:
                i += 1
            else:
                j += 1
        busy_main = sum(b - a for a, b in main)
        busy_codec = sum(b - a for a, b in codec)
        out["gpu_window_ms"] = hi - lo
        out["busy_fraction"] = {
            "frame_step_stream": busy_main / (hi - lo),
            "codec_stream": busy_codec / (hi - lo),
            "both": both / (hi - lo),
            "either": (busy_main + busy_codec - both) / (hi - lo),
        }
        out["batch_mean"] = float(np.mean([t["ready"] for t in self.ticks]))
        for k in ("live", "done_undecoded", "pending_frames"):
            out[f"{k}_mean"] = float(np.mean([t[k] for t in self.ticks]))
        # the run as a time series (tenths of the ticks): how the slots fill and what holds them
        parts = np.array_split(np.arange(len(self.ticks)), min(10, len(self.ticks)))
        keys = ("tick_ms", "ready", "live", "done_undecoded", "pending_frames", "codec_frames", "commands")
        out["phases"] = [
            {k: float(np.mean([self.ticks[i].get(k, 0) for i in idx])) for k in keys} for idx in parts if len(idx)
        ]
        return out


def traced_run(
    model: Qwen3TTSModel, args: argparse.Namespace, variant: dict[str, Any], rate: float
) -> dict[str, Any]:
    cfg = load_config("qwen3-tts", args.max_slots, **variant)
    engine = Engine(cfg, model=model).start()
    tracer = Tracer(engine, model)
    res: dict[str, Any] = {"memory_before": memory(model.device)}

    async def main() -> None:
        await closed_loop(engine, 4, 2.0, Lengths(), 999)
        tracer.on = True
        try:
            # bounded: an engine that collapses under the load still leaves its trace so far
            r = await asyncio.wait_for(
                open_loop(engine, rate, args.duration_s, Lengths(), 1), args.duration_s + args.drain_s
            )
            r.pop("arrivals", None)
        except TimeoutError:
            r = {"timed_out_after_s": args.duration_s + args.drain_s}
        tracer.on = False
        res["load"] = r

    try:
        asyncio.run(main())
    finally:
        engine.close()
    graphs, runner = model.graphs, model.codec_runner
    for obj in (graphs, runner, model, model.codes_to_host):  # the wrappers live on the instances: drop them
        for name in ("run", "decode_start", "generate_start", "start", "open_slot", "add_text"):
            obj.__dict__.pop(name, None)
    res["trace"] = tracer.summary()
    res["memory_after"] = memory(model.device)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1.7b")
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--max-batch", type=int, default=SERVED_MAX_BATCH)
    # ~1,000 streams are held at 400 req/s; this build gives each a full KV row (--max-seq-len), so
    # 2,048 slots do not fit an H100 beside the codec's graphs
    ap.add_argument("--max-slots", type=int, default=1024)
    ap.add_argument("--max-seq-len", type=int, default=512)
    ap.add_argument("--rates", default="170", help="req/s, each a run of every variant")
    ap.add_argument("--duration-s", type=float, default=6.0)
    ap.add_argument("--variants", default="served,noramp,steady24")
    ap.add_argument("--drain-s", type=float, default=40.0, help="longest wait for the load's last reply")
    ap.add_argument("--sections", default="contention,codec,convs,serve")
    ap.add_argument("--smoke", action="store_true", help="tiny model on the CPU: the harness only")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.smoke:
        args.size, args.device, args.dtype = "tiny", "cpu", "float32"
        args.max_batch, args.max_slots, args.duration_s, args.rates = 8, 16, 2.0, "4"
        args.sections = "serve"
    dev = torch.device(args.device)
    t0 = time.perf_counter()
    experimental = ExperimentalOptions(fused_kernels=False) if args.smoke else ExperimentalOptions()
    model = build(args, experimental, codec_graph_frames=48)
    res: dict[str, Any] = {"command": " ".join(sys.argv), "env": env(dev), "build_s": time.perf_counter() - t0}
    res["memory_after_build"] = memory(dev)

    def save() -> None:
        Path(args.out).write_text(json.dumps(res, indent=1, default=str))

    sections = args.sections.split(",")
    if "contention" in sections:
        res["contention"] = contention(model, args.max_batch, [(16, 4), (64, 12), (64, 24), (32, 48), (64, 48)])
        print(json.dumps(res["contention"])[:1500], flush=True)
        save()
    if "codec" in sections:
        res["codec_kernels"] = codec_kernels(model, [(1, 1), (16, 4), (64, 12)])
        save()
    if "convs" in sections:
        res["conv_layouts"] = [conv_layouts(model, 64, 12), conv_layouts(model, 16, 2)]
        save()
    if "serve" in sections:
        for rate in (float(r) for r in args.rates.split(",")):
            for name in args.variants.split(","):
                key = f"serve_{name}_{rate:g}"
                print(f"== {key}", flush=True)
                res[key] = traced_run(model, args, VARIANTS[name], rate)
                print(json.dumps(res[key]["load"])[:600], flush=True)
                print(json.dumps(res[key]["trace"])[:1500], flush=True)
                save()
    save()


if __name__ == "__main__":
    main()
