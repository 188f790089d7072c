"""The probe's read-outs: every process's turns as one result, percentile summaries, the terminal table, the PNG plot."""

from __future__ import annotations

import platform
import statistics
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np

from .probe_turn import ProbeConfig, TurnRecord

PERCENTILES = (50, 90, 95, 99)


def summarize(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    out: dict[str, float] = {"n": len(values)}
    for q in PERCENTILES:
        out[f"p{q}"] = round(float(np.percentile(values, q)), 2)
    out["max"] = round(max(values), 2)
    out["mean"] = round(statistics.fmean(values), 2)
    return out


def format_table(result: dict[str, Any]) -> str:
    s = result["summary"]
    errors = ", ".join(f"{k} {v}" for k, v in s["errors"].items() if v) or "none"
    lines = [
        f"turns {s['turns']} ({s['completed']} completed; errors: {errors}) on {s['sessions']} sessions, "
        f"{s['audio_s']:.1f} s of audio; underruns {s['underruns']} in {s['turns_with_underruns']} turns",
        f"{'':16}{'n':>5}" + "".join(f"{'p' + str(q):>9}" for q in PERCENTILES) + f"{'max':>9}",
    ]
    rows = [
        "ttfb_ms",
        "ttfa_ms",
        "e2e_ms",
        "server_ttfp_ms",
        "server_ttfa_ms",
        "engine_ttfp_ms",
        "jitter_buffer_ms",
        "rtp_jitter_ms",
        "connect_ms",
    ]
    for key in rows:
        v = s.get(key)
        if not v or not v.get("n"):
            continue
        lines.append(
            f"{key:16}{v['n']:>5}" + "".join(f"{v[f'p{q}']:>9.1f}" for q in PERCENTILES) + f"{v['max']:>9.1f}"
        )
    if "packets_received" in s:
        lines.append(f"RTP packets received {s['packets_received']}, lost {s['packets_lost']}")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: str) -> None:
    """Latency distribution (CDF) and latency over time, one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    turns = [t for t in result["turns"] if t["reason"] in ("completed", "cancelled", "length")]
    series = {
        "TTFB": [t["ttfb_ms"] for t in turns],
        "audible TTFA": [t["ttfa_ms"] for t in turns],
        "server TTFA": [t["server"].get("ttfa_ms") for t in turns],
    }
    fig, (ax_cdf, ax_time) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, values in series.items():
        v = np.sort([x for x in values if x is not None])
        if v.size:
            ax_cdf.step(
                v,
                np.arange(1, v.size + 1) / v.size,
                where="post",
                label=f"{name} (p50 {np.median(v):.0f} ms)",
            )
    ax_cdf.set_xlabel("ms from the first text sent")
    ax_cdf.set_ylabel("fraction of turns")
    ax_cdf.set_title("latency distribution")
    ax_cdf.grid(alpha=0.3)
    ax_cdf.legend(loc="lower right")
    t = [x["t_start_s"] for x in turns]
    for name, marker in (("TTFB", "."), ("audible TTFA", "o")):
        ax_time.scatter(t, series[name], s=12, marker=marker, label=name, alpha=0.8)
    under = [x for x in turns if x["underruns"]]
    if under:
        ax_time.scatter(
            [x["t_start_s"] for x in under],
            [x["ttfa_ms"] or 0 for x in under],
            s=60,
            facecolors="none",
            edgecolors="red",
            label="turn with underruns",
        )
    ax_time.set_xlabel("turn start (s into the run)")
    ax_time.set_ylabel("ms")
    ax_time.set_title("latency over time")
    ax_time.grid(alpha=0.3)
    ax_time.legend(loc="best")
    fig.suptitle(f"voicewire probe: {result['probe']['description']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


DONE = ("completed", "cancelled", "length")  # turns whose audio played


@dataclass
class ProbePart:
    """One probe process's turns and what it saw of itself, before the summary (picklable)."""

    records: list[TurnRecord]
    sessions: int
    connect_ms: list[float]
    receiver_stats: list[dict[str, float]]
    own: dict[str, Any]  # Probe._own


def report(cfg: ProbeConfig, server: dict[str, Any], parts: list[ProbePart]) -> dict[str, Any]:
    """The JSON-ready result of every process's part: the summary over all their turns."""
    records = [r for p in parts for r in p.records]
    receiver_stats = [s for p in parts for s in p.receiver_stats]
    done = [r for r in records if r.reason in DONE]

    def vals(get: Any) -> list[float]:
        return [v for v in (get(r) for r in done) if v is not None]

    own = [p.own for p in parts]
    summary: dict[str, Any] = {
        "turns": len(records),
        "completed": sum(1 for r in records if r.reason == "completed"),
        "cancelled": sum(1 for r in records if r.reason == "cancelled"),
        "cut": sum(1 for r in done if r.cut_ms is not None),
        "errors": {k: sum(1 for r in records if r.reason == k) for k in ("error", "failed", "timeout", "refused")},
        "sessions": sum(p.sessions for p in parts),
        "audio_s": round(sum(r.audio_ms for r in done) / 1000, 2),
        "underruns": sum(r.underruns for r in done),
        "turns_with_underruns": sum(1 for r in done if r.underruns),
        "connect_ms": summarize([ms for p in parts for ms in p.connect_ms]),
        "ttfb_ms": summarize(vals(lambda r: r.ttfb_ms)),
        "ttfa_ms": summarize(vals(lambda r: r.ttfa_ms)),
        "e2e_ms": summarize(vals(lambda r: r.e2e_ms)),
        "server_ttfp_ms": summarize(vals(lambda r: r.server.get("ttfp_ms"))),
        "server_ttfa_ms": summarize(vals(lambda r: r.server.get("ttfa_ms"))),
        # the engine's part of server_ttfp: first text -> first audio on the gateway's loop
        "engine_ttfp_ms": summarize(vals(lambda r: r.server.get("engine_ttfp_ms"))),
        "probe_process": {
            "processes": len(parts),
            "cpu_s": round(sum(o["cpu_s"] for o in own), 2),
            "wall_s": max(o["wall_s"] for o in own),
            "loop_lag_max_ms": max(o["loop_lag_max_ms"] for o in own),
            "loop_stalls": sum(o["loop_stalls"] for o in own),
            "gc_pause_max_ms": max(o["gc_pause_max_ms"] for o in own),
            "underran_while_held": sum(o["underran_while_held"] for o in own),
        },
    }
    if cfg.transport == "webrtc":
        summary["jitter_buffer_ms"] = summarize(vals(lambda r: r.jitter_buffer_ms))
        summary["rtp_jitter_ms"] = summarize(vals(lambda r: r.rtp_jitter_ms))
        summary["packets_received"] = int(sum(s.get("packets_received", 0) for s in receiver_stats))
        summary["packets_lost"] = int(sum(s.get("packets_lost", 0) for s in receiver_stats))
    return {
        "probe": {
            "description": cfg.describe(),
            "config": {k: v for k, v in asdict(cfg).items() if k != "api_key"},
            "started_utc": datetime.now(UTC).isoformat(timespec="seconds"),
            "client": f"{platform.node()} python {platform.python_version()}",
            "server": server,
        },
        "summary": summary,
        "turns": [asdict(r) for r in sorted(records, key=lambda r: r.t_start_s)],
    }
