"""``voicewire`` command line: ``serve`` the gateway, ``say`` a sentence to a WAV file, ``probe`` a
running server's latency."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import logging
import os
import ssl
import sys
import wave

import numpy as np

from voicewire.engine import MODEL_NAMES, Engine, EngineConfig
from voicewire.engine.core import EngineGroup, GroupConfig

from .audio import pcm16_bytes
from .auth import AuthConfig
from .config import GatewayConfig, IceServer, normalize_base_path, parse_networks
from .voices import default_voices_dir


class _UsageError(Exception):
    """A flag combination that cannot serve: one line, exit 2."""


# Defaults of the qwen3-tts flags. On CUDA: the configuration benchmarks/serving_bench.py measures
# (bf16, CUDA graphs captured at start, batch 256, codec buckets up to 64 streams x 48 frames, as
# many slots as fit). A 256-row frame step costs ~6% more than 128 rows on the H200 and makes twice
# the frames: past ~100 requests/s it is the difference between serving and refusing
# (benchmarks/results/throughput_h200.json).
CUDA_MAX_BATCH = 256
CPU_MAX_STREAMS = 16  # and the CPU's batch: a CPU runs a few real-time Qwen3 streams, not hundreds
DEFAULT_MAX_SEQ_LEN = 1536  # talker positions per stream: ~2 minutes of audio
# engine/qwen3/options.py AUTO_MAX_SLOTS (that package imports torch, the gateway need not): with
# --max-streams auto the model's slots decide, so the engine-wide limit must not be below them.
AUTO_MAX_STREAMS = 512


def _positive(value: str) -> int:
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
        return _positive(value)
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
        raise _UsageError("--replicas must be 0 or more")
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
        raise _UsageError(
            "--model qwen3-tts needs --checkpoint DIR (a Qwen3-TTS-12Hz checkpoint) "
            "or --random-weights (untrained: noise, for benchmarks and tests)"
        )
    if args.checkpoint is not None and args.random_weights:
        raise _UsageError("--checkpoint and --random-weights exclude each other")
    devices = _devices(args)
    kinds = {d.split(":")[0] for d in devices}
    if len(kinds) > 1:
        raise _UsageError(f"the devices mix kinds ({', '.join(devices)}): give one kind")
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
    }


def _engine_config(args: argparse.Namespace) -> EngineConfig:
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
        raise _UsageError(f"{given[0]} applies to --model qwen3-tts only")
    if isinstance(args.max_streams, int):
        return EngineConfig(
            model=args.model, max_streams=args.max_streams, queue_wait_s=wait_s, max_queued_streams=queued
        )
    return EngineConfig(model=args.model, queue_wait_s=wait_s, max_queued_streams=queued)


def _needs_torch(args: argparse.Namespace) -> str | None:
    """Why this model cannot run here (PyTorch missing), or None."""
    if args.model == "qwen3-tts" and importlib.util.find_spec("torch") is None:
        return (
            "qwen3-tts needs PyTorch, which is not installed here: install the torch build for "
            "your machine, then pip install -e '.[qwen,kernels]' (README: Serving Qwen3-TTS on a GPU)"
        )
    return None


# Engine cores when neither --replicas nor --devices is given (0 = the engine in the gateway's
# process). Qwen3-TTS on a GPU: one core, out of the gateway's GIL (in one process, gateway work
# delayed frame steps: 56 of 641 turns late at 80 req/s where the engine alone had none). The
# embedded voice on a CPU: in the gateway's process. On 2 cores a third busy process costs more than
# the GIL: 75 streaming sessions held with zero underruns in 3 of 3 in-process runs of
# benchmarks/ws_bench.py and 1 of 4 through a core (a 16-19 ms stall at 50 sessions, or 1.4 ms at
# 25), with the same TTFP and the same 10-peer WebRTC packet gaps (ws_core_vs_inprocess_cpu.json,
# core_ipc_cpu.json). --replicas 1 gives the embedded voice a supervised core.
DEFAULT_REPLICAS = {"hibari": 0}
DEFAULT_REPLICAS_OTHER = 1


def _engine_group(args: argparse.Namespace, engine: EngineConfig) -> EngineGroup | None:
    """The engine cores ``serve`` runs (None: the engine runs in the gateway's process)."""
    replicas = _replicas(args)
    if replicas == 0:
        if args.devices:
            raise _UsageError("--devices needs engine cores: --replicas 1 or more")
        return None
    return EngineGroup(engine, GroupConfig(replicas=replicas, devices=_devices(args)))


def _model_name(name: str) -> str:
    if name in MODEL_NAMES or ":" in name:
        return name
    raise argparse.ArgumentTypeError(
        f"unknown model {name!r} (choose from {', '.join(MODEL_NAMES)}, or package.module:factory)"
    )


def _add_model_args(p: argparse.ArgumentParser) -> None:
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
        help="streams held at once; qwen3-tts: a number, or auto (default on cuda): as many as fit in "
        f"free GPU memory at --max-seq-len, at most {AUTO_MAX_STREAMS}; {CPU_MAX_STREAMS} on cpu",
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
        type=_positive,
        help=f"qwen3-tts: streams per frame step (default {CUDA_MAX_BATCH} on cuda, {CPU_MAX_STREAMS} on cpu)",
    )
    p.add_argument(
        "--max-seq-len",
        type=_positive,
        help=f"qwen3-tts: talker positions per stream, 12.5 a second of audio (default {DEFAULT_MAX_SEQ_LEN})",
    )


class _StartFailed(Exception):
    """The model could not load or warm up (in this process)."""


async def _say(engine_config: EngineConfig, text: str, out_path: str, speed: float) -> float:
    engine = Engine(engine_config)
    try:
        await asyncio.get_running_loop().run_in_executor(None, engine.start)
    except Exception as err:  # one line for the user (a bad checkpoint, no CUDA), not a traceback
        raise _StartFailed(f"{type(err).__name__}: {err}") from err
    async with engine:
        stream = engine.open_stream(speed=speed)
        stream.push_text(text)
        stream.end()
        pcm = [chunk.pcm async for chunk in stream]
        rate = engine.info.sample_rate_hz
    audio = np.concatenate(pcm) if pcm else np.zeros(0, np.float32)
    with wave.open(out_path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm16_bytes(audio))
    return audio.size / rate


class _JsonFormatter(logging.Formatter):
    """One JSON object per line; records logged with ``extra`` ids (session, turn) carry them."""

    FIELDS = ("session_id", "turn_id", "transport")

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        out.update({k: getattr(record, k) for k in self.FIELDS if getattr(record, k, None) is not None})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def _ice_servers(args: argparse.Namespace) -> tuple[IceServer, ...]:
    """``--ice-server`` URLs as the RTCIceServer entries peers get: one for the STUN urls, one for
    the TURN urls, which share ``--ice-username`` / ``--ice-credential`` (one TURN deployment
    has one credential; the environment variable keeps it off the process list)."""
    urls = [u.strip() for u in args.ice_server]
    username = args.ice_username
    credential = args.ice_credential or os.environ.get("VOICEWIRE_ICE_CREDENTIAL") or None
    stun = tuple(u for u in urls if u.startswith(("stun:", "stuns:")))
    turn = tuple(u for u in urls if u.startswith(("turn:", "turns:")))
    other = [u for u in urls if u not in stun and u not in turn]
    if other:
        raise _UsageError(f"--ice-server {other[0]!r}: give a stun:, stuns:, turn: or turns: URL")
    if turn and not (username and credential):
        raise _UsageError(
            "a turn: --ice-server needs --ice-username and --ice-credential (or VOICEWIRE_ICE_CREDENTIAL)"
        )
    if (username or args.ice_credential) and not turn:
        raise _UsageError("--ice-username / --ice-credential apply to a turn: --ice-server; none was given")
    try:
        servers = [IceServer(stun)] if stun else []
        if turn:
            servers.append(IceServer(turn, username=username, credential=credential))
    except ValueError as err:
        raise _UsageError(f"--ice-server: {err}") from None
    return tuple(servers)


def _base_path(value: str) -> str:
    try:
        return normalize_base_path(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _network(value: str) -> str:
    try:
        parse_networks((value,))
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return value


def _setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(
        _JsonFormatter()
        if fmt == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")
    )
    logging.basicConfig(level=level.upper(), handlers=[handler])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voicewire", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway (WebSocket, HTTP, WebRTC, demo page)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--log-level", default="info")
    serve.add_argument(
        "--log-format", choices=("text", "json"), default="text", help="json: one object per line"
    )
    serve.add_argument(
        "--api-key",
        action="append",
        default=[],
        help="turn auth on: this key (repeatable; also VOICEWIRE_API_KEYS, comma-separated)",
    )
    serve.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        help="exact browser Origin allowed (repeatable), e.g. https://app.example.com",
    )
    serve.add_argument(
        "--public-metrics",
        action="store_true",
        help="serve GET /metrics without the API key (for a scraper on a private network)",
    )
    serve.add_argument("--max-sessions", type=int, default=GatewayConfig.max_sessions)
    serve.add_argument(
        "--write-stall-timeout",
        type=float,
        default=GatewayConfig.write_stall_timeout_s,
        help="seconds a client may stop reading before it is closed with 4008",
    )
    serve.add_argument(
        "--drain-timeout",
        type=float,
        default=GatewayConfig.drain_timeout_s,
        help="on SIGTERM, seconds current turns may take to finish",
    )
    serve.add_argument(
        "--voices-dir",
        default=str(default_voices_dir()),
        help="where cloned voices (POST /v1/audio/voices) are kept, and loaded from at start "
        "(default: %(default)s)",
    )
    deploy = serve.add_argument_group("deployment (README: Deploying)")
    deploy.add_argument(
        "--base-path",
        type=_base_path,
        metavar="PATH",
        default="",
        help="serve everything under this prefix, e.g. /voice behind a proxy that passes /voice/... "
        "through unchanged (the page, its assets, /v1/stream, /offer, speech, probes, metrics)",
    )
    deploy.add_argument(
        "--trusted-proxy",
        type=_network,
        metavar="ADDRESS",
        action="append",
        default=[],
        help="believe X-Forwarded-For/-Proto/-Host from this address or network (repeatable; "
        "default: from no one)",
    )
    deploy.add_argument("--tls-cert", metavar="PEM", help="serve HTTPS/WSS on the port itself: PEM certificate chain")
    deploy.add_argument("--tls-key", metavar="PEM", help="the PEM private key of --tls-cert")
    deploy.add_argument(
        "--ice-server",
        action="append",
        metavar="URL",
        default=[],
        help="a STUN or TURN server for WebRTC, given to the page and used by the server's peers "
        "(repeatable): stun:stun.example.com:3478, turn:turn.example.com:3478?transport=udp, "
        "turns:turn.example.com:5349?transport=tcp",
    )
    deploy.add_argument("--ice-username", metavar="NAME", help="the TURN username of the turn: --ice-server URLs")
    deploy.add_argument(
        "--ice-credential",
        metavar="SECRET",
        help="the TURN credential (prefer VOICEWIRE_ICE_CREDENTIAL: arguments are visible to every user)",
    )
    _add_model_args(serve)
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
    say = sub.add_parser("say", help="synthesize text to a WAV file")
    say.add_argument("text")
    say.add_argument("-o", "--output", default="out.wav")
    say.add_argument("--speed", type=float, default=1.0)
    _add_model_args(say)
    # The probe is client code: its options are parsed by its own parser, imported only here.
    sub.add_parser(
        "probe",
        help="measure a running server: TTFB, audible TTFA, underruns, end-to-end",
        add_help=False,
        prefix_chars="\0",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)

    if args.command == "probe":
        from .client.probe_cli import main as probe_main

        return probe_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")

    try:
        engine_config = _engine_config(args)
        group = _engine_group(args, engine_config) if args.command == "serve" else None
        if args.command == "serve":
            args.ice_servers = _ice_servers(args)
            if (args.tls_cert is None) != (args.tls_key is None):
                raise _UsageError("--tls-cert and --tls-key go together")
    except _UsageError as err:
        print(f"voicewire {args.command}: {err}", file=sys.stderr)
        return 2
    unmet = _needs_torch(args)
    if unmet is not None:
        print(f"voicewire {args.command}: {unmet}", file=sys.stderr)
        return 1
    if args.command == "serve":
        return _serve(args, engine_config, group)
    if not args.text.strip():
        print("voicewire say: text is empty", file=sys.stderr)
        return 2
    try:
        seconds = asyncio.run(_say(engine_config, args.text, args.output, args.speed))
    except _StartFailed as err:
        print(f"voicewire say: the model failed to start: {err}", file=sys.stderr)
        return 1
    print(f"wrote {args.output} ({seconds:.2f} s of audio)")
    return 0


def _serve(args: argparse.Namespace, engine: EngineConfig, group: EngineGroup | None) -> int:
    _setup_logging(args.log_level, args.log_format)
    from .server import EngineStartFailed, tls_context
    from .server import serve as run_server

    if engine.model == "qwen3-tts" and args.random_weights:
        logging.getLogger("voicewire").warning(
            "serving qwen3-tts with random weights (%s shapes): the audio is noise", args.qwen_size
        )
    keys = [*args.api_key, *filter(None, os.environ.get("VOICEWIRE_API_KEYS", "").split(","))]
    config = GatewayConfig(
        host=args.host,
        port=args.port,
        engine=engine,
        auth=AuthConfig(api_keys=tuple(keys), allowed_origins=tuple(args.allow_origin)),
        max_sessions=args.max_sessions,
        public_metrics=args.public_metrics,
        write_stall_timeout_s=args.write_stall_timeout,
        drain_timeout_s=args.drain_timeout,
        voices_dir=args.voices_dir,
        base_path=args.base_path,
        trusted_proxies=tuple(args.trusted_proxy),
        tls_cert_file=args.tls_cert,
        tls_key_file=args.tls_key,
        ice_servers=args.ice_servers,
    )
    try:
        tls_context(config)  # a missing or mismatched certificate or key: one line, before anything starts
    except (ssl.SSLError, OSError) as err:
        print(f"voicewire serve: cannot load --tls-cert / --tls-key: {err}", file=sys.stderr)
        return 1
    try:
        asyncio.run(run_server(config, group))
    except KeyboardInterrupt:
        pass
    except EngineStartFailed as err:
        print(f"voicewire serve: the model failed to start: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # the port is taken, or the address is not this machine's
        print(
            f"voicewire serve: cannot listen on {config.host}:{config.port}: {err.strerror}", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
