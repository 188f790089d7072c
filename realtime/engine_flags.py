"""What ``--model`` and its flags make: the engine's configuration (``EngineConfig``) and, when the
engine runs in core processes, their group (``EngineGroup``). ``serve`` and ``say`` share them."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from voicewire.engine import MODEL_NAMES, EngineConfig
from voicewire.engine.core import EngineGroup, GroupConfig
from voicewire.engine.core.group import HANG_TIMEOUT_S


class UsageError(Exception):
    """A flag combination that cannot serve: one line, exit 2."""


# Defaults of the qwen3-tts flags. On CUDA: the configuration benchmarks/serving_bench.py measures
# (bf16, CUDA graphs captured at start, batch 512, codec buckets up to 64 streams x 48 frames, as
# many slots as fit). A frame step is bound by its ~1,000 dependent launches more than by its rows,
# so 512 rows take about 1.5x the time of 256 for twice the frames: at the loads where more than 256
# streams are ready that is the difference between serving and falling behind, for a longer first
# step of a new turn under such a load (docs/performance-history.md, twenty-first pass).
CUDA_MAX_BATCH = 512
CPU_MAX_STREAMS = 16  # and the CPU's batch: a CPU runs a few real-time Qwen3 streams, not hundreds
DEFAULT_MAX_SEQ_LEN = 1536  # talker positions per stream: ~2 minutes of audio
# engine/qwen3/options.py AUTO_MAX_SLOTS (that package imports torch, the gateway need not): with
# --max-streams auto the model's slots decide, so the engine-wide limit must not be below them.
AUTO_MAX_STREAMS = 2048


def positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value!r}")
    return n


def _non_negative(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value!r}")
    return n


def _streams(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        return positive_int(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a number >= 1 or 'auto', got {value!r}") from None


def _devices(args: argparse.Namespace) -> tuple[str, ...]:
    devices = getattr(args, "devices", None) or args.device
    return tuple(d.strip() for d in devices.split(",") if d.strip())


def _replicas(args: argparse.Namespace) -> int:
    replicas = getattr(args, "replicas", 0)
    if replicas is None:
        return len(_devices(args)) if args.devices else DEFAULT_REPLICAS.get(args.model, DEFAULT_REPLICAS_OTHER)
    if replicas < 0:
        raise UsageError("--replicas must be 0 or more")
    return int(replicas)


def _memory_share(devices: tuple[str, ...], replicas: int) -> float:
    """The part of its GPU each engine core may size its slots from: 1 / the most cores on one
    device (``--replicas 2`` on one GPU: half each; round-robin as EngineGroup places them)."""
    if replicas <= 1:
        return 1.0
    placed = [devices[i % len(devices)] for i in range(replicas)]
    return 1.0 / max(placed.count(d) for d in set(placed))


def _qwen3_options(args: argparse.Namespace) -> dict[str, object]:
    """``load_qwen3``'s options from the flags; the defaults follow the device kind."""
    if args.checkpoint is None and not args.random_weights:
        raise UsageError(
            "--model qwen3-tts needs --checkpoint DIR (a Qwen3-TTS-12Hz checkpoint) "
            "or --random-weights (untrained: noise, for benchmarks and tests)"
        )
    if args.checkpoint is not None and args.random_weights:
        raise UsageError("--checkpoint and --random-weights exclude each other")
    devices = _devices(args)
    kinds = {d.split(":")[0] for d in devices}
    if len(kinds) > 1:
        raise UsageError(f"the devices mix kinds ({', '.join(devices)}): give one kind")
    cuda = kinds == {"cuda"}
    return {
        "checkpoint": args.checkpoint,
        "size": args.qwen_size,
        "device": devices[0],
        "dtype": args.dtype or ("bf16" if cuda else "float32"),
        "max_slots": args.max_streams or ("auto" if cuda else CPU_MAX_STREAMS),
        "max_batch_size": args.max_batch or (CUDA_MAX_BATCH if cuda else CPU_MAX_STREAMS),
        "max_seq_len": args.max_seq_len or DEFAULT_MAX_SEQ_LEN,
        "memory_share": _memory_share(devices, _replicas(args)),
        "cache_dir": args.cache_dir,
    }


def to_engine_config(args: argparse.Namespace) -> EngineConfig:
    wait_s = args.queue_wait_ms / 1000
    queued = args.max_queued if wait_s > 0 else 0
    if args.model == "qwen3-tts":
        options = _qwen3_options(args)
        slots = options["max_slots"]
        return EngineConfig(
            model=args.model,
            model_options=options,
            max_streams=AUTO_MAX_STREAMS if slots == "auto" else int(slots),  # type: ignore[call-overload]
            queue_wait_s=wait_s,
            max_queued_streams=queued,
        )
    given = [
        flag
        for flag, value in (
            ("--checkpoint", args.checkpoint),
            ("--random-weights", args.random_weights),
            ("--dtype", args.dtype),
            ("--max-batch", args.max_batch),
            ("--max-seq-len", args.max_seq_len),
        )
        if value
    ]
    if given:
        raise UsageError(f"{given[0]} applies to --model qwen3-tts only")
    if isinstance(args.max_streams, int):
        return EngineConfig(
            model=args.model, max_streams=args.max_streams, queue_wait_s=wait_s, max_queued_streams=queued
        )
    return EngineConfig(model=args.model, queue_wait_s=wait_s, max_queued_streams=queued)


def unmet_requirements(args: argparse.Namespace) -> str | None:
    """Why this model cannot run here, in one line: a checkpoint that is not there first, then every
    package it needs that is missing, all at once; or None."""
    if args.model != "qwen3-tts":
        return None
    if args.checkpoint is not None and not (Path(args.checkpoint).expanduser() / "config.json").is_file():
        return f"--checkpoint {args.checkpoint}: not a Qwen3-TTS checkpoint directory (no config.json there)"
    # weights and the tokenizer are read from a checkpoint; random weights need neither
    needed = ("torch", "safetensors", "tokenizers") if args.checkpoint is not None else ("torch",)
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    torch_first = "install the torch build for your machine, then " if "torch" in missing else ""
    extras = "qwen,kernels" if str(args.device).startswith("cuda") else "qwen"  # Triton: GPU kernels only
    return (
        f"qwen3-tts needs {', '.join(missing)}, not installed here: {torch_first}"
        f"pip install -e '.[{extras}]' (README: Serving Qwen3-TTS on a GPU)"
    )


# Engine cores when neither --replicas nor --devices is given (0 = the engine in the gateway's
# process). Qwen3-TTS on a GPU: one core, out of the gateway's GIL (in one process, gateway work
# delayed frame steps: 56 of 641 turns late at 80 req/s where the engine alone had none). The
# embedded voice on a CPU: in the gateway's process. On 2 cores a third busy process costs more than
# the GIL: 75 streaming sessions held with zero underruns in 3 of 4 in-process runs of
# benchmarks/ws_bench.py and 1 of 4 through a core (a 16-19 ms stall at 50 sessions, or 1.4 ms at
# 25), with the same TTFP and the same 10-peer WebRTC packet gaps (ws_core_vs_inprocess_cpu.json,
# core_ipc_cpu.json). --replicas 1 gives the embedded voice a supervised core.
DEFAULT_REPLICAS = {"hibari": 0}
DEFAULT_REPLICAS_OTHER = 1


def engine_group(args: argparse.Namespace, engine: EngineConfig) -> EngineGroup | None:
    """The engine cores ``serve`` runs (None: the engine runs in the gateway's process)."""
    replicas = _replicas(args)
    if replicas == 0:
        if args.devices:
            raise UsageError("--devices needs engine cores: --replicas 1 or more")
        return None
    if args.hang_timeout <= 0:
        raise UsageError("--hang-timeout must be more than 0")
    return EngineGroup(
        engine, GroupConfig(replicas=replicas, devices=_devices(args), hang_timeout_s=args.hang_timeout)
    )


def add_core_args(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="engine cores, one process each, spread over --devices (0: the engine runs in the "
        "gateway's process; default: 0 for the embedded voice, 1 for qwen3-tts, or one per device "
        "when --devices is given)",
    )
    serve.add_argument(
        "--devices",
        default=None,
        help="comma-separated devices for the engine cores, round-robin (cuda:0,cuda:1; a device "
        "may repeat; default: --device)",
    )
    serve.add_argument(
        "--hang-timeout",
        type=float,
        default=HANG_TIMEOUT_S,
        metavar="SECONDS",
        help="an engine core that was ready and has sent no heartbeat (twice a second) for this long "
        "is stuck: it is killed and started again",
    )


def _model_name(name: str) -> str:
    if name in MODEL_NAMES or ":" in name:
        return name
    raise argparse.ArgumentTypeError(
        f"unknown model {name!r} (choose from {', '.join(MODEL_NAMES)}, or package.module:factory)"
    )


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        type=_model_name,
        default="hibari",
        help="hibari: the embedded English voice (default); qwen3-tts: Qwen3-TTS-12Hz; "
        "or package.module:factory for a model of your own",
    )
    p.add_argument("--checkpoint", help="qwen3-tts: a local checkpoint directory in the Hugging Face layout")
    p.add_argument(
        "--random-weights",
        action="store_true",
        help="qwen3-tts without a checkpoint: untrained weights of --qwen-size (noise; benchmarks, tests)",
    )
    p.add_argument(
        "--qwen-size",
        default="tiny",
        choices=("tiny", "tiny-base", "0.6b", "1.7b"),
        help="qwen3-tts --random-weights: the shape of the random weights "
        "(tiny-base: a Base model, which clones voices)",
    )
    p.add_argument("--device", default="cpu", help="qwen3-tts: torch device (cpu, cuda)")
    p.add_argument(
        "--dtype",
        choices=("bf16", "fp16", "float32"),
        help="qwen3-tts: weights and activations (default bf16 on cuda, float32 on cpu)",
    )
    p.add_argument(
        "--max-streams",
        type=_streams,
        help="streams held at once; qwen3-tts: a number, or auto (default on cuda): as many as can start "
        f"in free GPU memory (their KV comes from a shared pool of blocks), at most {AUTO_MAX_STREAMS}; "
        f"{CPU_MAX_STREAMS} on cpu",
    )
    p.add_argument(
        "--queue-wait-ms",
        type=_non_negative,
        default=round(EngineConfig.queue_wait_s * 1000),
        help="a turn that finds every stream busy waits this long for one to end before "
        "server_busy (default %(default)s; 0: refuse at once)",
    )
    p.add_argument(
        "--max-queued",
        type=_non_negative,
        default=EngineConfig.max_queued_streams,
        help="turns that may wait at once, per engine (default %(default)s)",
    )
    p.add_argument(
        "--max-batch",
        type=positive_int,
        help=f"qwen3-tts: streams per frame step (default {CUDA_MAX_BATCH} on cuda, {CPU_MAX_STREAMS} on cpu)",
    )
    p.add_argument(
        "--max-seq-len",
        type=positive_int,
        help=f"qwen3-tts: talker positions per stream, 12.5 a second of audio (default {DEFAULT_MAX_SEQ_LEN})",
    )
    p.add_argument(
        "--cache-dir",
        help="qwen3-tts on cuda: compiled kernels kept across starts, so a second start loads them "
        "(default $XDG_CACHE_HOME/voicewire or ~/.cache/voicewire)",
    )
