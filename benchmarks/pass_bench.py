"""The code predictor's 15 passes of one stream: the persistent pass kernel against the kernel chain (GPU).

    python3 benchmarks/pass_bench.py --size 1.7b --out pass.json

Both run the same 15 passes (the two-row first pass, then 14 one-row passes looked up in the codebook
tables), without sampling, each side captured in one CUDA graph; the time is per pass. Then one launch
of each kind of pass kernel records program 0's SM clock at every phase boundary
(kernels/decoder_pass.py's ``stamps``): per phase type, the cycles spent working and waiting at the grid
barrier before it, summed over the layers.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.qwen3 import ServeOptions, load_qwen3
from kernels.decoder_pass import decoder_pass

PHASES = ("A q|k|v", "B attention", "C o + residual", "D gate|up", "E down + residual")


def graph_us(fn: Any, reps: int = 50) -> float:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps * 1e3


def phase_cycles(stamps: list[int], n_layers: int) -> dict[str, Any]:
    """Stamps 0 start, 1 after the PDL wait, 2 after P0; per layer 3 + 10 l .. 12 + 10 l (barrier passed /
    phase done, five phases); then the head's barrier passed and head done."""
    work = dict.fromkeys(PHASES, 0)
    wait = dict.fromkeys(PHASES, 0)
    prev = stamps[2]
    for layer in range(n_layers):
        base = 3 + 10 * layer
        for i, name in enumerate(PHASES):
            passed, done = stamps[base + 2 * i], stamps[base + 2 * i + 1]
            wait[name] += passed - prev
            work[name] += done - passed
            prev = done
    head_passed, head_done = stamps[3 + 10 * n_layers], stamps[4 + 10 * n_layers]
    return {
        "total_cycles": head_done - stamps[0],
        "input_projection_cycles": stamps[2] - stamps[1],
        "work_cycles": work,
        "barrier_wait_cycles": wait,
        "head_wait_cycles": head_passed - prev,
        "head_cycles": head_done - head_passed,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1.7b")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dev = torch.device("cuda")
    opts = ServeOptions(max_slots=1, max_batch_size=1, max_seq_len=64, cuda_graphs=False)
    model = load_qwen3(None, args.size, device=dev, dtype="bf16", seed=0, options=opts)
    fused = model.step.fused
    assert fused is not None and fused.pass_weights is not None
    cfg = fused.cp.cfg
    n_layers = len(fused.cp_layers)
    shape = (n_layers, 1, cfg.num_kv_heads, fused.cp_positions, cfg.head_dim)
    k, v = (
        torch.zeros(shape, device=dev, dtype=torch.bfloat16),
        torch.zeros(shape, device=dev, dtype=torch.bfloat16),
    )
    first = torch.randn(2, fused.talker.codec_embedding.weight.shape[1], device=dev).to(torch.bfloat16)
    code = torch.randint(0, cfg.vocab_size, (1,), device=dev)
    tables = [cast(nn.Embedding, e).weight for e in fused.cp.codec_embedding]
    passes = cfg.num_code_groups - 1
    rows = fused.rows(1)
    run: dict[str, Any] = {
        "weights": fused.pass_weights,
        "k_cache": k,
        "v_cache": v,
        "counter": fused.pass_counter,
        "pdl": fused.pdl,
    }

    def persistent(staging: str) -> None:
        decoder_pass(first, head=fused.cp_heads[0], pos0=0, staging=staging, **run)
        for j in range(1, passes):
            decoder_pass(
                tables[j - 1], head=fused.cp_heads[j], pos0=j + 1, index=code, staging=staging, **run
            )

    def chain() -> None:
        h = fused._project(first)
        for i, w in enumerate(fused.cp_layers):
            h = fused._layer(
                w,
                h,
                rows.pairs,
                rows.pair_positions,
                rows.pair_lengths,
                k[i],
                v[i],
                fused.cp_freqs,
                rows.predictor_pair_plan,
            )
        norm = fused.cp.norm
        fused._linear(h[-1:], fused.cp_heads[0], norm.weight, norm.eps, logits=True)
        for j in range(1, passes):
            h = fused._embed_project(tables[j - 1], code)
            for i, w in enumerate(fused.cp_layers):
                h = fused._layer(
                    w,
                    h,
                    rows.index,
                    rows.pass_positions[j + 1],
                    rows.pass_lengths[j + 1],
                    k[i],
                    v[i],
                    fused.cp_freqs,
                    rows.predictor_plan,
                )
            fused._linear(h, fused.cp_heads[j], norm.weight, norm.eps, logits=True)

    res: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "device": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "size": args.size,
        "chain_us_per_pass": graph_us(chain) / passes,
    }
    print(f"[pass] chain {res['chain_us_per_pass']:.1f} us per pass")
    stamps = torch.zeros(64, dtype=torch.int64, device=dev)
    for staging in ("registers", "l2"):
        us = graph_us(partial(persistent, staging)) / passes
        res[f"persistent_{staging}_us_per_pass"] = us
        print(f"[pass] persistent, weights staged in {staging}: {us:.1f} us per pass")
        calls = {
            "first_pass": partial(decoder_pass, first, head=fused.cp_heads[0], pos0=0),
            "later_pass": partial(decoder_pass, tables[0], head=fused.cp_heads[1], pos0=2, index=code),
        }
        for name, call in calls.items():
            for _ in range(3):
                call(stamps=stamps, staging=staging, **run)
            torch.cuda.synchronize()
            key = f"{staging}_{name}"
            res[key] = phase_cycles(stamps.tolist(), n_layers)
            print(f"[stamps {key}] {json.dumps(res[key])}")
    Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
