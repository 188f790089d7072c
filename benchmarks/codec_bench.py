"""The streaming codec decoder alone on the GPU: CUDA-graph time per (streams x frames) call, its
kernels by name, and how far bf16 is from fp32.

    python3 benchmarks/codec_bench.py --size 1.7b --out codec.json        # on the lent H200

Random weights with the real shapes (benchmarks' usual ``randomize``), bf16, the SnakeBeta kernel,
cuDNN timing its conv algorithms while each graph is captured (as the served model does). Each call
is ``CodecDecoder.stream`` over B rows of T valid frames from a fresh state, as CodecRunner calls it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serving_bench import env, gpu_ms, kernels_by_name

from voicewire.engine.qwen3.presets import preset
from voicewire.engine.qwen3.weights import build_modules, randomize


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1.7b")
    ap.add_argument("--shapes", default="1x1,1x12,4x4,16x1,16x4,16x12,32x12,64x4,64x12,16x48,64x48")
    ap.add_argument("--profile", default="64x12,16x4")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dev = torch.device("cuda")
    mods = build_modules(preset(args.size), dev, torch.bfloat16, torch.bfloat16)
    randomize(mods, 0)
    codec = mods.codec
    codec.prepare(kernels=True)
    q, fs = codec.cfg.num_quantizers, codec.cfg.frame_samples
    res: dict[str, Any] = {"command": " ".join(sys.argv), "env": env(dev), "calls": {}, "kernels": {}}
    gen = torch.Generator(device=dev).manual_seed(0)
    graphs: dict[str, Any] = {}
    torch.backends.cudnn.benchmark = True
    for spec in args.shapes.split(","):
        b, t = map(int, spec.split("x"))
        codes = torch.randint(0, codec.cfg.codebook_size, (b, q, t), device=dev, generator=gen)
        state, start = codec.fresh_state(b)
        n_valid = torch.full((b,), t, dtype=torch.int64, device=dev)
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for _ in range(2):
                codec.stream(codes, state, start, n_valid)
        torch.cuda.current_stream(dev).wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            codec.stream(codes, state, start, n_valid)
        graphs[spec] = (g, codes, state, start, n_valid)  # a graph reads its inputs where they were
        ms = gpu_ms(g.replay, dev, 10)
        res["calls"][spec] = {"graph_ms": ms, "frames_per_s": b * t / (ms / 1e3)}
        print(f"[codec] {spec}: {ms:.2f} ms, {b * t / (ms / 1e3):,.0f} frames/s", flush=True)
    torch.backends.cudnn.benchmark = False
    for spec in args.profile.split(","):
        if spec not in graphs:
            continue
        res["kernels"][spec] = kernels_by_name(graphs[spec][0].replay, dev, top=20)
    # bf16 against the same weights in fp32 (TF32 off), 3 rows x 12 frames: the served precision's cost
    codes = torch.randint(0, codec.cfg.codebook_size, (3, q, 12), device=dev, generator=gen)
    pcm16 = codec.decode(codes)
    codec.float()
    codec.prepare(kernels=True)
    pcm32 = codec.decode(codes)
    err = (pcm16 - pcm32).norm() / pcm32.norm()
    res["bf16_vs_fp32_rel_err"] = float(err)
    res["pcm_rms"] = float(pcm32.pow(2).mean().sqrt())
    res["samples"] = pcm32.shape[1] // fs * fs
    print(f"[codec] bf16 vs fp32: rel err {float(err):.4f}", flush=True)
    Path(args.out).write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
