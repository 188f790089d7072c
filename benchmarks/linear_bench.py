"""The fused decode linear (kernels/fused_linear.py) against cuBLAS, and a sweep of its tile configs.

    python3 benchmarks/linear_bench.py --out linear.json          # CUDA (~1-2 min)

Shapes: every projection of the Qwen3-TTS-1.7B frame step (talker and code predictor, and the two
heads) at M = 1, 16, 64, 128 rows (or --rows: 256 is a loaded server's batch, 512+ a prefill's prompt
positions), bf16, each in the form the step runs it (q|k|v and gate|up with the
RMS-norm prologue, gate|up with the SwiGLU epilogue, o and down with the residual epilogue). The
baseline is what the unfused step launches for the same work: torch's RMS norm (compiled: one kernel)
is left out, so cuBLAS gets only its GEMM (+ the separate SwiGLU / residual kernels are not counted
either): a lower bound for the unfused side. GB/s = weight bytes (+ x, out) / time; weights rotate over
copies adding up to 4x the L2 so every call reads HBM (kernels_bench.py's timing, reused).
The chosen config per (M, N, K) is the fastest of the sweep; ``linear_config``'s pick is reported beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels_bench import copy_rate_gb_s, device_info, l2_bytes, time_per_call_us

from voicewire.kernels.fused_linear import (
    ACT_SILU_MUL,
    LinearConfig,
    fit_shared_memory,
    fused_linear,
    linear_config,
)

# (name, N, K, form): form = norm | silu_mul | residual | head
SHAPES_1_7B = [
    ("talker.qkv", 4096, 2048, "norm"),
    ("talker.o", 2048, 2048, "residual"),
    ("talker.gate_up", 6144, 2048, "silu_mul"),
    ("talker.down", 2048, 6144, "residual"),
    ("talker.head", 3072, 2048, "head"),
    ("cp.qkv", 4096, 1024, "norm"),
    ("cp.o", 1024, 2048, "residual"),
    ("cp.gate_up", 3072, 1024, "silu_mul"),
    ("cp.down", 1024, 3072, "residual"),
    ("cp.head", 2048, 1024, "head"),
]
ROWS = (1, 16, 64, 128)
SWEEP_ROWS = (1, 64)  # up to 64 rows the other row counts time linear_config's pick only
SWEEP = [
    LinearConfig(0, bn, bk, w, s)
    for bn in (16, 32, 64)
    for bk in (256, 512)
    for w, s in ((4, 3), (8, 3), (4, 5))
]
# above 64 rows (every row count is swept): the compute-bound tiles, block_m given
WIDE_SWEEP = [
    LinearConfig(bm, bn, bk, w, s)
    for bm, bn, w in ((64, 32, 4), (64, 64, 4), (128, 32, 4), (128, 64, 4), (128, 64, 8), (128, 128, 8))
    for bk, s in ((64, 4), (128, 3))
]


def bench_shape(name: str, n: int, k: int, form: str, m: int, copy_gb_s: float) -> dict[str, Any]:
    dev, dt = "cuda", torch.bfloat16
    w_rows = 2 * n if form == "silu_mul" else n
    w_bytes = w_rows * k * 2
    copies = max(2, -(-4 * l2_bytes() // w_bytes))
    ws = [torch.randn(w_rows, k, device=dev, dtype=dt) * k**-0.5 for _ in range(copies)]
    x = torch.randn(m, k, device=dev, dtype=dt)
    g = torch.rand(k, device=dev, dtype=dt) + 0.5
    res = torch.randn(m, n, device=dev, dtype=dt)
    kwargs: dict[str, Any] = {}
    if form in ("norm", "silu_mul", "head"):
        kwargs["norm_weight"] = g
    if form == "silu_mul":
        kwargs["act"] = ACT_SILU_MUL
    if form == "residual":
        kwargs["residual"] = res
    if form == "head":
        kwargs["out_dtype"] = torch.float32
    moved = w_bytes + m * k * 2 + m * n * (4 if form == "head" else 2)

    def ours(cfg: LinearConfig | None) -> float:
        def fn() -> None:
            for w in ws:
                fused_linear(x, w, config=cfg, **kwargs)

        return time_per_call_us(fn, copies)[0]

    def cublas() -> None:
        for w in ws:
            F.linear(x, w)

    row: dict[str, Any] = {"name": name, "M": m, "N": n, "K": k, "form": form, "weight_mb": w_bytes / 1e6}
    row["cublas_gemm_only_us"] = time_per_call_us(cublas, copies)[0]
    picked = fit_shared_memory(linear_config(m, n, k, kwargs.get("act", 0)), kwargs.get("act", 0), 2)
    row["default"] = {"config": picked.__dict__, "us": ours(None)}
    best: dict[str, Any] | None = None
    tried = set()
    sweep = WIDE_SWEEP if m > 64 else SWEEP if m in SWEEP_ROWS else []
    for c in sweep:
        bm = c.block_m or linear_config(m, n, k).block_m
        cfg = LinearConfig(bm, c.block_n, c.block_k, c.num_warps, c.num_stages)
        cfg = fit_shared_memory(cfg, kwargs.get("act", 0), 2)  # what the launcher would run
        if cfg in tried:
            continue
        tried.add(cfg)
        try:
            us = ours(cfg)
        except Exception as err:  # out of shared memory / registers for this tile
            torch.cuda.synchronize()
            row.setdefault("refused", []).append([cfg.__dict__, str(err).splitlines()[0][:120]])
            continue
        if best is None or us < best["us"]:
            best = {"config": cfg.__dict__, "us": us}
    row["best"] = best
    for key in ("default", "best"):
        if row[key]:
            row[key]["gb_s"] = moved / (row[key]["us"] * 1e-6) / 1e9
            row[key]["of_copy_rate"] = row[key]["gb_s"] / copy_gb_s
    # correctness at the chosen config against the unfused torch ops
    ref_x = x.float()
    if "norm_weight" in kwargs:
        ref_x = (ref_x * torch.rsqrt(ref_x.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dt) * g
    w0 = ws[0]
    ref = F.linear(ref_x.to(dt), w0)
    if form == "silu_mul":
        ref = F.silu(ref[:, :n]) * ref[:, n:]
    if form == "residual":
        ref = res + ref
    out = fused_linear(x, w0, **kwargs)
    row["rel_err"] = float((out.float() - ref.float()).norm() / ref.float().norm())
    ws.clear()
    torch.cuda.empty_cache()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--rows", default=",".join(map(str, ROWS)))
    args = ap.parse_args()
    copy = copy_rate_gb_s()
    results: dict[str, Any] = {"command": " ".join(sys.argv), "device": device_info(), "copy_rate_gb_s": copy}
    rows = []
    for m in (int(r) for r in args.rows.split(",")):
        for name, n, k, form in SHAPES_1_7B:
            r = bench_shape(name, n, k, form, m, copy)
            rows.append(r)
            b = r["best"] or {}
            print(
                f"[linear] {name:15s} M={m:3d} cublas {r['cublas_gemm_only_us']:7.2f} us | default "
                f"{r['default']['us']:7.2f} us {r['default']['gb_s']:6.0f} GB/s | best {b.get('us', 0):7.2f} us "
                f"{b.get('gb_s', 0):6.0f} GB/s {b.get('config')} | err {r['rel_err']:.1e}",
                flush=True,
            )
            results["rows"] = rows
            args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
