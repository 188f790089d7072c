"""The probe's read-outs: percentile summaries, the terminal table, the PNG plot."""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

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
