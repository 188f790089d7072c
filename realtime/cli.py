"""``voicewire`` command line: ``serve`` the gateway, ``say`` a sentence to a WAV file, ``probe`` a
running server's latency."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import wave

import numpy as np

from voicewire.engine import MODEL_NAMES, Engine, EngineConfig
from voicewire.engine.core import EngineGroup, GroupConfig

from .audio import pcm16_bytes
from .auth import AuthConfig
from .config import GatewayConfig


def _engine_config(args: argparse.Namespace) -> EngineConfig:
    options: dict[str, object] = {}
    if args.model == "qwen3-tts":
        options = {"checkpoint": args.checkpoint, "size": args.qwen_size, "device": args.device}
    elif args.checkpoint:
        raise SystemExit("--checkpoint applies to --model qwen3-tts only")
    return EngineConfig(model=args.model, model_options=options)


# Engine cores when neither --replicas nor --devices is given (0 = the engine in the gateway's
# process). One core on 2 CPU cores: engine TTFP is the same either way (the boundary costs ~0.1 ms
# a chunk), and with the engine's worker out of the gateway's GIL, 10 WebRTC peers' packet gaps
# are tighter (benchmarks/core_ipc_bench.py).
DEFAULT_REPLICAS = 1


def _engine_group(args: argparse.Namespace, engine: EngineConfig) -> EngineGroup | None:
    """The engine cores ``serve`` runs (None: the engine runs in the gateway's process)."""
    devices = tuple(d.strip() for d in (args.devices or args.device).split(",") if d.strip())
    replicas = args.replicas
    if replicas is None:
        replicas = len(devices) if args.devices else DEFAULT_REPLICAS
    if replicas == 0:
        if args.devices:
            raise SystemExit("--devices needs engine cores: --replicas 1 or more")
        return None
    return EngineGroup(engine, GroupConfig(replicas=replicas, devices=devices))


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
        "--qwen-size",
        default="tiny",
        choices=("tiny", "0.6b", "1.7b"),
        help="qwen3-tts without --checkpoint: random weights of this shape",
    )
    p.add_argument("--device", default="cpu", help="qwen3-tts: torch device (cpu, cuda)")


async def _say(engine_config: EngineConfig, text: str, out_path: str, speed: float) -> float:
    async with Engine(engine_config) as engine:
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


def _setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(
        _JsonFormatter()
        if fmt == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")
    )
    logging.basicConfig(level=level.upper(), handlers=[handler])


def main(argv: list[str] | None = None) -> int:
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
    _add_model_args(serve)
    serve.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="engine cores, one process each, spread over --devices (0: the engine runs in the "
        f"gateway's process; default {DEFAULT_REPLICAS}, or one per device when --devices is given)",
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
    args, rest = parser.parse_known_args(argv)

    if args.command == "probe":
        from .client.probe_cli import main as probe_main

        return probe_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")

    if args.command == "serve":
        _setup_logging(args.log_level, args.log_format)
        from .server import EngineStartFailed
        from .server import serve as run_server

        keys = [*args.api_key, *filter(None, os.environ.get("VOICEWIRE_API_KEYS", "").split(","))]
        config = GatewayConfig(
            host=args.host,
            port=args.port,
            engine=_engine_config(args),
            auth=AuthConfig(api_keys=tuple(keys), allowed_origins=tuple(args.allow_origin)),
            max_sessions=args.max_sessions,
            public_metrics=args.public_metrics,
            write_stall_timeout_s=args.write_stall_timeout,
            drain_timeout_s=args.drain_timeout,
        )
        if args.replicas is not None and args.replicas < 0:
            parser.error("--replicas must be 0 or more")
        group = _engine_group(args, config.engine)
        try:
            asyncio.run(run_server(config, group))
        except KeyboardInterrupt:
            pass
        except EngineStartFailed as err:
            print(f"voicewire serve: the model failed to start: {err}", file=sys.stderr)
            return 1
        except OSError as err:  # the port is taken, or the address is not this machine's
            print(f"voicewire serve: cannot listen on {config.host}:{config.port}: {err.strerror}", file=sys.stderr)
            return 1
        return 0
    if not args.text.strip():
        print("voicewire say: text is empty", file=sys.stderr)
        return 2
    seconds = asyncio.run(_say(_engine_config(args), args.text, args.output, args.speed))
    print(f"wrote {args.output} ({seconds:.2f} s of audio)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
