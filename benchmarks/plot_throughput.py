"""The throughput curve of a ``gpu.sh throughput`` run as a PNG: per engine variant, aggregate
audio-s/s, p50 / p95 TTFP and the shares of requests that underran or were refused, against the
request rate.

    python3 benchmarks/plot_throughput.py benchmarks/results/throughput_h200.json throughput_h200.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main() -> None:
    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    res = json.loads(src.read_text())
    variants = {k[len("serve_") :]: v["open_loop"] for k, v in res.items() if k.startswith("serve_") and "open_loop" in v}
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(13, 4))
    for i, (name, pts) in enumerate(variants.items()):
        rates, color = [p["rate"] for p in pts], f"C{i}"
        a.plot(rates, [p["audio_s_per_s"] for p in pts], "o-", color=color, label=name)
        b.plot(rates, [p["ttfp_ms_p95"] for p in pts], "s-", color=color, label=f"{name} p95")
        b.plot(rates, [p["ttfp_ms_p50"] for p in pts], "o:", color=color, label=f"{name} p50")
        underran = [100 * p["underrun_requests"] / max(1, p["completed"]) for p in pts]
        c.plot(rates, underran, "o-", color=color, label=f"{name} underran")
        refused = [100 * p["rejected"] / max(1, p["requests"]) for p in pts]
        c.plot(rates, refused, "x--", color=color, label=f"{name} refused (slots full)")
    rates = sorted({p["rate"] for pts in variants.values() for p in pts})
    a.plot(rates, [r * 4.6 for r in rates], color="grey", ls=":", lw=1, label="offered (4.6-s mix)")
    b.axhline(100, color="grey", ls=":", lw=1)
    c.set_ylim(bottom=0)
    for ax, label in ((a, "audio-s/s (in the load's window)"), (b, "engine TTFP (ms)"), (c, "requests underran / refused (%)")):
        ax.set_xlabel("request rate (Poisson, req/s)")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    meta = res.get("meta", {})
    size = res.get("size", "1.7b").upper()
    fig.suptitle(f"{src.name} at {meta.get('commit', '?')}: {size}, 512 slots, batch 256, one H200", fontsize=9)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main()
