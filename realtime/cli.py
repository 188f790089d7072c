"""``voicewire`` command line: ``serve`` the gateway, ``say`` a sentence to a WAV file, ``probe`` a
running server's latency; across hosts, ``engine`` cores on Ray and ``gateway`` in front of them."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import ssl
import sys
import wave

import numpy as np

from voicewire.engine import Engine, EngineConfig
from voicewire.engine.core import EngineGroup
from voicewire.engine.core.host_cores import HostCores

from .audio import pcm16_bytes
from .auth import AuthConfig, token_secret
from .cli_ray import add_ray_commands, add_ray_serve_args, ray_cores, run_ray_command
from .config import MIN_SESSIONS, GatewayConfig, IceServer, normalize_base_path, parse_networks
from .engine_flags import (
    UsageError,
    add_core_args,
    add_model_args,
    engine_group,
    positive_int,
    to_engine_config,
    unmet_requirements,
)
from .limits import ClientQuotas
from .reference_audio import ReferenceLimits
from .serve_workers import Supervisor, add_worker_args, workers_for
from .voices import default_voices_dir


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
        raise UsageError(f"--ice-server {other[0]!r}: give a stun:, stuns:, turn: or turns: URL")
    if turn and not (username and credential):
        raise UsageError(
            "a turn: --ice-server needs --ice-username and --ice-credential (or VOICEWIRE_ICE_CREDENTIAL)"
        )
    if (username or args.ice_credential) and not turn:
        raise UsageError("--ice-username / --ice-credential apply to a turn: --ice-server; none was given")
    try:
        servers = [IceServer(stun)] if stun else []
        if turn:
            servers.append(IceServer(turn, username=username, credential=credential))
    except ValueError as err:
        raise UsageError(f"--ice-server: {err}") from None
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
    if level != "debug":
        # aioice writes a line per ICE connectivity check at INFO: dozens per call, none an operator needs
        logging.getLogger("aioice").setLevel(logging.WARNING)


class _DefaultsFormatter(argparse.HelpFormatter):
    """Each flag's default in its help, where it has one worth saying and the help does not say it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, False, "", [], argparse.SUPPRESS) or text == argparse.SUPPRESS:
            return text
        return f"{text} (default: %(default)s)"


def add_gateway_args(p: argparse.ArgumentParser) -> None:
    """The gateway's flags (``serve`` and ``gateway``): listening, logs, auth, limits, deployment."""
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    # each of several gateway processes on one port (gateway_procs.py): the port shared, and the
    # directory they share
    p.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--peers-dir", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=8080, help="TCP port to listen on")
    p.add_argument(
        "--log-level",
        default="info",
        type=str.lower,
        choices=("debug", "info", "warning", "error"),
        help="the log's threshold",
    )
    p.add_argument(
        "--log-format", choices=("text", "json"), default="text", help="json: one object per line"
    )
    p.add_argument(
        "--api-key",
        action="append",
        default=[],
        help="turn auth on: this key (repeatable; also VOICEWIRE_API_KEYS, comma-separated)",
    )
    p.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        help="exact browser Origin allowed (repeatable), e.g. https://app.example.com",
    )
    p.add_argument(
        "--public-metrics",
        action="store_true",
        help="serve GET /metrics without the API key (for a scraper on a private network)",
    )
    p.add_argument(
        "--max-sessions",
        type=int,
        default=GatewayConfig.max_sessions,
        help=f"sessions per process (default: as many as the engine has streams, at least {MIN_SESSIONS})",
    )
    p.add_argument(
        "--max-speech-requests",
        type=positive_int,
        default=GatewayConfig.max_speech_requests,
        help="speech requests streaming at once in all (default: as many as the engine runs and queues)",
    )
    p.add_argument(
        "--max-sessions-per-client",
        type=int,
        default=ClientQuotas.max_sessions,
        help="sessions one client (an API key, else an address) may hold at once; 0: no limit "
        "(default: a quarter of the session limit)",
    )
    p.add_argument(
        "--max-speech-per-client",
        type=int,
        default=ClientQuotas.max_speech_requests,
        help="speech requests one client may stream at once; 0: no limit "
        "(default: a quarter of the speech limit, at least 4)",
    )
    p.add_argument(
        "--max-voices-per-client",
        type=int,
        default=ReferenceLimits.max_voices_per_client,
        help="cloned voices one client may store; 0: no per-client limit",
    )
    p.add_argument(
        "--max-voices",
        type=int,
        default=ReferenceLimits.max_voices,
        help="cloned voices the server stores in all",
    )
    p.add_argument(
        "--no-fair-share",
        action="store_true",
        help="let one client open engine streams past its fair share while other clients are active",
    )
    p.add_argument(
        "--write-stall-timeout",
        type=float,
        default=GatewayConfig.write_stall_timeout_s,
        help="seconds a client may stop reading before it is closed with 4008",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=GatewayConfig.drain_timeout_s,
        help="on SIGTERM, seconds current turns may take to finish",
    )
    p.add_argument(
        "--voices-dir",
        default=str(default_voices_dir()),
        help="where cloned voices (POST /v1/audio/voices) are kept, and loaded from at start "
        "(default: %(default)s)",
    )
    deploy = p.add_argument_group("deployment (README: Deploying)")
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
        "--demo-token-url",
        metavar="URL",
        help="with --api-key: where the demo page gets a session token (your backend's endpoint "
        "that calls POST /v1/session-tokens; example: deploy/token_backend.py)",
    )
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voicewire", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve", help="run the gateway (WebSocket, HTTP, WebRTC, demo page)", formatter_class=_DefaultsFormatter
    )
    add_gateway_args(serve)
    add_model_args(serve)
    add_core_args(serve)
    add_ray_serve_args(serve)
    add_worker_args(serve)
    add_ray_commands(sub, _DefaultsFormatter, add_gateway_args)
    say = sub.add_parser("say", help="synthesize text to a WAV file")
    say.add_argument("text")
    say.add_argument("-o", "--output", default="out.wav")
    say.add_argument("--speed", type=float, default=1.0)
    add_model_args(say)
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
    if args.command in ("engine", "gateway"):
        return run_ray_command(args, argv if argv is not None else sys.argv[1:], _serve)

    workers = 1
    try:
        engine_config = to_engine_config(args)
        group = engine_group(args, engine_config) if args.command == "serve" else None
        if args.command == "serve":
            workers = workers_for(args, cores=group is not None)
            if args.ray is not None:
                group = ray_cores(args, engine_config)
            elif args.cores_file:  # a worker of `serve --workers N`: the cores its supervisor started
                group = HostCores(args.cores_file, engine_config)
            _ice_servers(args)  # a bad --ice-server: a usage error before anything starts
            if (args.tls_cert is None) != (args.tls_key is None):
                raise UsageError("--tls-cert and --tls-key go together")
    except (UsageError, ValueError) as err:
        print(f"voicewire {args.command}: {err}", file=sys.stderr)
        return 2
    unmet = unmet_requirements(args)
    if unmet is not None:
        print(f"voicewire {args.command}: {unmet}", file=sys.stderr)
        return 1
    if args.command == "serve" and workers > 1:
        assert group is not None
        _setup_logging(args.log_level, args.log_format)
        child_argv = [sys.executable, "-m", "voicewire.realtime.cli", *(argv if argv is not None else sys.argv[1:])]
        return Supervisor(workers, child_argv, engine_config, group.group).run()
    if args.command == "serve":
        return _serve(args, engine_config, group, reuse_port=args.reuse_port)
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


def gateway_config(args: argparse.Namespace, engine: EngineConfig) -> GatewayConfig:
    """The gateway's configuration from ``serve``'s flags (API keys also from VOICEWIRE_API_KEYS)."""
    keys = [*args.api_key, *filter(None, os.environ.get("VOICEWIRE_API_KEYS", "").split(","))]
    return GatewayConfig(
        host=args.host,
        port=args.port,
        engine=engine,
        auth=AuthConfig(
            api_keys=tuple(keys),
            allowed_origins=tuple(args.allow_origin),
            secret=token_secret(os.environ),
            spent_dir=os.path.join(args.peers_dir, "spent-tokens") if args.peers_dir else None,
        ),
        max_sessions=args.max_sessions,
        max_speech_requests=args.max_speech_requests,
        quotas=ClientQuotas(
            max_sessions=args.max_sessions_per_client,
            max_speech_requests=args.max_speech_per_client,
            fair_share=not args.no_fair_share,
        ),
        voice_limits=ReferenceLimits(max_voices_per_client=args.max_voices_per_client, max_voices=args.max_voices),
        public_metrics=args.public_metrics,
        write_stall_timeout_s=args.write_stall_timeout,
        drain_timeout_s=args.drain_timeout,
        voices_dir=args.voices_dir,
        base_path=args.base_path,
        trusted_proxies=tuple(args.trusted_proxy),
        tls_cert_file=args.tls_cert,
        tls_key_file=args.tls_key,
        ice_servers=_ice_servers(args),
        demo_token_url=args.demo_token_url,
        peers_dir=args.peers_dir,
    )


def _serve(
    args: argparse.Namespace, engine: EngineConfig, group: EngineGroup | None, *, reuse_port: bool = False
) -> int:
    _setup_logging(args.log_level, args.log_format)
    from .server import EngineStartFailed, tls_context
    from .server import serve as run_server

    if engine.model == "qwen3-tts" and args.random_weights:
        logging.getLogger("voicewire").warning(
            "serving qwen3-tts with random weights (%s shapes): the audio is noise", args.qwen_size
        )
    try:
        config = dataclasses.replace(gateway_config(args, engine), shared_port=reuse_port)
    except (ValueError, UsageError) as err:  # a flag's value the config refuses (a short --api-key, ...)
        print(f"voicewire serve: {err}", file=sys.stderr)
        return 2
    try:
        tls_context(config)  # a missing or mismatched certificate or key: one line, before anything starts
    except (ssl.SSLError, OSError) as err:
        print(f"voicewire serve: cannot load --tls-cert / --tls-key: {err}", file=sys.stderr)
        return 1
    try:
        asyncio.run(run_server(config, group, reuse_port=reuse_port))
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
