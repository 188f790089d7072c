"""``voicewire probe``'s command line (imported only when that subcommand runs)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from .probe import ProbeConfig, probe
from .probe_report import format_table, plot
from .probe_turn import TURNS_PER_PROC


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="http://127.0.0.1:8080", help="the server's base URL")
    p.add_argument("--transport", choices=("ws", "webrtc"), default="ws")
    p.add_argument("--duration", type=float, default=30.0, help="seconds during which turns start")
    load = p.add_mutually_exclusive_group()
    load.add_argument(
        "--concurrency", type=int, default=1, help="closed loop: sessions speaking turns back to back"
    )
    load.add_argument("--rate", type=float, help="open loop: Poisson turn arrivals per second")
    p.add_argument(
        "--first-token-ms", type=float, default=0.0, help="the simulated LLM's time to first token"
    )
    text = p.add_mutually_exclusive_group()
    text.add_argument(
        "--tokens-per-s", type=float, default=30.0, help="simulated LLM speed (a token is a word)"
    )
    text.add_argument("--whole", action="store_true", help="send each reply in one text.delta")
    p.add_argument(
        "--buffer-ms", type=float, default=40.0, help="client playout buffer for the underrun count"
    )
    p.add_argument("--gap-s", type=float, default=0.2, help="closed loop: pause between a session's turns")
    p.add_argument(
        "--clients",
        type=int,
        default=1,
        help="WebSocket sessions from this many loopback addresses (the server's per-client quotas "
        "see as many clients; a load test of one client meets them)",
    )
    p.add_argument(
        "--max-sessions",
        type=int,
        help="open loop: open sessions as arrivals need them, at most this many (default: no cap)",
    )
    p.add_argument(
        "--session-per-turn",
        action="store_true",
        help="open loop: each arrival opens its own session and closes it after its turn",
    )
    p.add_argument(
        "--barge-in",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="the share of turns the listener cuts with turn.cancel, as a user barging in",
    )
    p.add_argument(
        "--barge-in-after",
        default="0.3,1.5",
        metavar="MIN,MAX",
        help="how far into the turn's playout a barge-in comes, seconds (uniform)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--procs",
        type=int,
        default=0,
        help=f"open loop: client processes sharing the arrivals (default: one per {TURNS_PER_PROC:g} turns/s; "
        "one Python loop reading hundreds of sessions stamps their audio late)",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("VOICEWIRE_API_KEY"),
        help="for a server started with --api-key (default: $VOICEWIRE_API_KEY)",
    )
    p.add_argument("--out", default="probe.json", help="JSON results")
    p.add_argument("--plot", default="probe.png", help="PNG plot ('' for none)")


def config_from_args(args: argparse.Namespace) -> ProbeConfig:
    return ProbeConfig(
        url=args.url,
        transport=args.transport,
        duration_s=args.duration,
        concurrency=args.concurrency,
        rate_per_s=args.rate,
        gap_s=args.gap_s,
        max_sessions=args.max_sessions,
        session_per_turn=args.session_per_turn,
        first_token_delay_ms=args.first_token_ms,
        tokens_per_s=None if args.whole else args.tokens_per_s,
        buffer_ms=args.buffer_ms,
        seed=args.seed,
        api_key=args.api_key,
        clients=args.clients,
        barge_in=args.barge_in,
        barge_in_after_s=_seconds_range(args.barge_in_after),
        procs=args.procs,
    )


def _seconds_range(value: str) -> tuple[float, float]:
    low, _, high = value.partition(",")
    try:
        return float(low), float(high or low)
    except ValueError:
        raise SystemExit(f"voicewire probe: --barge-in-after takes MIN,MAX seconds, not {value!r}") from None


def main(argv: list[str]) -> int:
    """``voicewire probe ARGS``."""
    parser = argparse.ArgumentParser(
        prog="voicewire probe",
        description="Drive a running server with simulated LLM turns and measure what a listener gets.",
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    print(f"voicewire probe: {cfg.describe()}", file=sys.stderr)
    result = asyncio.run(probe(cfg))
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(format_table(result))
    plotted = False
    if args.plot:
        try:
            plot(result, args.plot)
            plotted = True
        except ImportError:  # the measurement is kept whatever the plot needs
            print(
                f"voicewire probe: no plot ({args.plot}): it needs matplotlib: pip install 'voicewire[plot]'",
                file=sys.stderr,
            )
    print(f"wrote {args.out}" + (f" and {args.plot}" if plotted else ""))
    summary = result["summary"]
    return 0 if summary["completed"] + summary["cancelled"] else 1
