"""The one-row linears of the B = 1 frame step as they run there: dependent chains of PDL launches in a
CUDA graph, on the one-/two-row kernel (kernels/gemv.py) against the tiled kernel (kernels/fused_linear.py).

    python3 benchmarks/gemv_bench.py --out gemv.json          # CUDA (~1-2 min)

Two chains with the Qwen3-TTS-1.7B shapes, bf16, random weights, one row:
  * predictor: the code predictor's 15 passes (each: embedding lookup + projection, 5 layers, a head),
    the same 5 layers' weights every pass (165 MB: more than the L2, so every pass reads HBM);
  * talker: its 28 layers once.
A layer is the four linears with their fused prologues / epilogues: norm + q|k|v, o + residual (its
input the q columns of q|k|v: attention and q/k norm are left out), norm + gate|up + SwiGLU,
down + residual; each launch reads the output of the one before it. Reported per chain: time, the
weight bytes over the device's copy rate, and how far the GEMV path's output is from the tiled one's.
Variants: the tiled kernel (``gemv_rows=0``) and the GEMV path's default bands; then, one shape at a
time, a sweep of its band height, chunk depth and warps with every other shape at the default (the
chain's time against the default's), and the chain with each shape's best.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels_bench import copy_rate_gb_s, device_info, time_per_call_us

from voicewire.kernels.fused_linear import ACT_SILU_MUL, fused_linear
from voicewire.kernels.gemv import GemvConfig, gemv_config

PREFETCH = 128 << 10  # the served FusedSettings.prefetch_kib
# (hidden, q columns, q|k|v rows, intermediate, layers, passes, vocab of the head or 0)
CHAINS = {"predictor": (1024, 2048, 4096, 3072, 5, 15, 2048), "talker": (2048, 2048, 4096, 6144, 28, 1, 0)}
# per-shape candidates: (band rows, K chunk, warps)
SWEEP = [
    GemvConfig(2, 2048, 4),
    GemvConfig(2, 4096, 4),
    GemvConfig(4, 4096, 4),
    GemvConfig(4, 4096, 8),
    GemvConfig(8, 1024, 2),
    GemvConfig(4, 1024, 4),
    GemvConfig(4, 2048, 4),
    GemvConfig(4, 2048, 8),
    GemvConfig(8, 512, 4),
    GemvConfig(8, 1024, 4),
    GemvConfig(8, 1024, 8),
    GemvConfig(8, 2048, 8),
    GemvConfig(16, 512, 8),
    GemvConfig(16, 1024, 8),
]

Pick = Callable[[int, int], GemvConfig | None]


def make_weights(dev: str, hidden: int, q: int, qkv: int, inter: int, layers: int, passes: int, vocab: int):
    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=dev, dtype=torch.bfloat16) * shape[-1] ** -0.5

    ws: dict[str, Any] = {
        "layers": [
            (
                torch.rand(hidden, device=dev, dtype=torch.bfloat16) + 0.5,
                rand(qkv, hidden),
                rand(hidden, q),
                torch.rand(hidden, device=dev, dtype=torch.bfloat16) + 0.5,
                rand(2 * inter, hidden),
                rand(hidden, inter),
            )
            for _ in range(layers)
        ]
    }
    if vocab:
        ws["table"] = torch.randn(vocab, 2048, device=dev, dtype=torch.bfloat16)
        ws["proj"], ws["proj_bias"] = (
            rand(hidden, 2048),
            torch.zeros(hidden, device=dev, dtype=torch.bfloat16),
        )
        ws["heads"] = [rand(vocab, hidden) for _ in range(passes)]
        ws["head_norm"] = torch.rand(hidden, device=dev, dtype=torch.bfloat16) + 0.5
    return ws


def weight_bytes(ws: dict[str, Any], passes: int) -> int:
    per_pass = sum(t.numel() * 2 for layer in ws["layers"] for t in layer)
    if "heads" in ws:
        per_pass += ws["proj"].numel() * 2 + ws["heads"][0].numel() * 2
    return per_pass * passes


def run_chain(ws: dict[str, Any], x0: torch.Tensor, index: torch.Tensor, passes: int, pick: Pick | None):
    def lin(x: torch.Tensor, w: torch.Tensor, **kw: Any) -> torch.Tensor:
        cfg = pick(w.shape[0] // (2 if kw.get("act") == ACT_SILU_MUL else 1), w.shape[1]) if pick else None
        rows = 2 if pick else 0
        return fused_linear(x, w, pdl=True, prefetch_bytes=PREFETCH, gemv_rows=rows, config=cfg, **kw)

    outs = []
    h = x0
    for p in range(passes):
        if "heads" in ws:
            h = lin(ws["table"], ws["proj"], bias=ws["proj_bias"], index=index)
        for ln1, qkv_w, o_w, ln2, gu_w, down_w in ws["layers"]:
            qkv = lin(h, qkv_w, norm_weight=ln1)
            x = lin(qkv[:, : o_w.shape[1]], o_w, residual=h)
            g = lin(x, gu_w, norm_weight=ln2, act=ACT_SILU_MUL)
            h = lin(g, down_w, residual=x)
        if "heads" in ws:
            outs.append(lin(h, ws["heads"][p], norm_weight=ws["head_norm"], out_dtype=torch.float32))
    outs.append(h.float())
    return outs


def shapes_of(chain: str) -> list[tuple[int, int]]:
    """The distinct (N, K) of a chain's linears (gate|up by its N)."""
    hidden, q, qkv, inter, _, _, vocab = CHAINS[chain]
    shapes = [(qkv, hidden), (hidden, q), (inter, hidden), (hidden, inter)]
    if vocab:
        shapes += [(hidden, 2048), (vocab, hidden)]  # the projection, the heads
    return list(dict.fromkeys(shapes))


def with_override(shape: tuple[int, int], cfg: GemvConfig) -> Pick:
    def pick(n: int, k: int) -> GemvConfig:
        if (n, k) == shape:
            return GemvConfig(cfg.block_n, min(cfg.block_k, 1 << (k - 1).bit_length()), cfg.num_warps)
        return gemv_config(n, k)

    return pick


def bench_chain(chain: str, copy: float) -> dict[str, Any]:
    hidden, q, qkv, inter, layers, passes, vocab = CHAINS[chain]
    dev = "cuda"
    torch.manual_seed(0)
    ws = make_weights(dev, hidden, q, qkv, inter, layers, passes, vocab)
    x0 = torch.randn(1, hidden, device=dev, dtype=torch.bfloat16)
    index = torch.tensor([7], device=dev, dtype=torch.int32)
    floor_us = weight_bytes(ws, passes) / (copy * 1e9) * 1e6 / passes
    rows: dict[str, Any] = {"floor_us_per_pass": floor_us, "passes": passes, "variants": {}, "per_shape": {}}
    ref = run_chain(ws, x0, index, passes, None)

    def timed(name: str, pick: Pick | None) -> float | None:
        def fn() -> None:
            run_chain(ws, x0, index, passes, pick)

        try:
            got = run_chain(ws, x0, index, passes, pick)
            err = max(float((a - b).norm() / b.norm()) for a, b in zip(got, ref, strict=True))
            us = time_per_call_us(fn, passes)[0]
        except Exception as e:  # a config out of registers / shared memory: record and go on
            torch.cuda.synchronize()
            rows["variants"][name] = {"error": str(e).splitlines()[0][:200]}
            print(f"[{chain}] {name}: {rows['variants'][name]['error']}", flush=True)
            return None
        rows["variants"][name] = {"us_per_pass": us, "rel_err_vs_tiled": err}
        print(f"[{chain}] {name:44s} {us:8.1f} us/pass (floor {floor_us:.1f}) err {err:.1e}", flush=True)
        return us

    timed("tiled", None)
    base = timed("gemv", gemv_config)
    best: dict[tuple[int, int], GemvConfig] = {}
    for shape in shapes_of(chain):
        default = gemv_config(*shape)
        results = []
        k_pow2 = 1 << (shape[1] - 1).bit_length()
        for cfg in dict.fromkeys(GemvConfig(c.block_n, min(c.block_k, k_pow2), c.num_warps) for c in SWEEP):
            us = timed(f"{shape} {cfg}", with_override(shape, cfg))
            if us is not None:
                results.append((us, cfg))
        us, cfg = min(results, key=lambda r: r[0])
        if base is not None and us > base:
            us, cfg = base, default
        best[shape] = cfg
        rows["per_shape"][str(shape)] = {"default": default.__dict__, "best": cfg.__dict__, "us": us}

    def best_pick(n: int, k: int) -> GemvConfig:
        return best.get((n, k)) or gemv_config(n, k)

    timed("gemv, each shape's best", best_pick)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--chains", default="predictor,talker")
    args = ap.parse_args()
    copy = copy_rate_gb_s()
    res: dict[str, Any] = {"command": " ".join(sys.argv), "device": device_info(), "copy_rate_gb_s": copy}
    for chain in args.chains.split(","):
        res[chain] = bench_chain(chain, copy)
        args.out.write_text(json.dumps(res, indent=1))
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
