"""The codec decoder's convs of k > 1 alone (dense and depthwise), each at the input a codec call of (rows, frames) gives it:
cuDNN with its algorithms timed for that shape (what the served graphs capture), cuDNN's heuristic
pick (no timing), and kernels/conv1d.py's implicit GEMM (one compiled variant for every length).

    python3 benchmarks/conv_bench.py --out conv_h200.json           # CUDA, bf16 (`gpu.sh kernels conv`)
    python3 benchmarks/conv_bench.py --smoke --out /tmp/conv.json   # CPU, Triton interpreter, tiny codec

The inputs are the real decoder's: one streamed call of random codes through the codec (random
weights) records every such conv's whole input (its history, then the call's steps); each is then
run alone per variant, CUDA events around ``--iters`` back-to-back calls, the median of 3 repeats.
Also each layer's cuDNN-timing seconds (its first call with benchmark on: a start-up cost per shape)
and the kernel's difference from cuDNN. Smoke mode checks the script, not the speed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serving_bench import gpu_ms

from voicewire.engine.qwen3.codec_decoder import CausalConv, CodecDecoder, _conv_nhwc
from voicewire.engine.qwen3.presets import preset
from voicewire.kernels.conv1d import conv1d_tm, stack_taps, tiles


def record_inputs(codec: CodecDecoder, rows: int, frames: int, seed: int) -> list[tuple[CausalConv, torch.Tensor]]:
    """Every k > 1 conv's whole input in one streamed call of ``rows`` x ``frames`` random codes."""
    seen: list[tuple[CausalConv, torch.Tensor]] = []
    run = CausalConv.run

    def recording(self: CausalConv, xx: torch.Tensor, bias: bool = False) -> torch.Tensor:
        if self.conv.kernel_size[0] > 1:
            seen.append((self, xx.clone()))
        return run(self, xx, bias)

    dev = codec.codebook_sum.device
    g = torch.Generator(device=dev).manual_seed(seed)
    codes = torch.randint(0, codec.cfg.codebook_size, (rows, codec.cfg.num_quantizers, frames), generator=g, device=dev)
    state, start = codec.fresh_state(rows)
    CausalConv.run = recording  # type: ignore[method-assign]
    try:
        codec.stream(codes, state, start)
    finally:
        CausalConv.run = run  # type: ignore[method-assign]
    return seen


def bench_layer(
    m: CausalConv, xx: torch.Tensor, iters: int, other_tiles: list[tuple[int, int, int]]
) -> dict[str, Any]:
    c = m.conv
    k, d = c.kernel_size[0], c.dilation[0]
    taps = stack_taps(c.weight.detach())
    cudnn = torch.backends.cudnn

    def on_cudnn() -> torch.Tensor:
        return _conv_nhwc(xx, m.w4, None, d, c.groups)

    def on_kernel() -> torch.Tensor:
        return conv1d_tm(xx, taps, k, d, depthwise=c.groups > 1)

    row: dict[str, Any] = {
        "cin": c.in_channels,
        "cout": c.out_channels,
        "kernel": k,
        "groups": c.groups,
        "dilation": d,
        "rows": xx.shape[0],
        "positions": xx.shape[1] - m.history,
    }
    before = cudnn.benchmark
    try:
        cudnn.benchmark = True
        t = time.perf_counter()
        ref = on_cudnn()  # cuDNN times its algorithms for this shape on this first call
        if xx.is_cuda:
            torch.cuda.synchronize()
        row["cudnn_timing_s"] = round(time.perf_counter() - t, 3)
        row["timed_ms"] = round(gpu_ms(on_cudnn, xx.device, iters), 4)
        cudnn.benchmark = False
        row["heuristic_ms"] = round(gpu_ms(on_cudnn, xx.device, iters), 4)
    finally:
        cudnn.benchmark = before
    out = on_kernel()
    row["kernel_ms"] = round(gpu_ms(on_kernel, xx.device, iters), 4)
    row["kernel_rel_err"] = float((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))
    row["kernel_over_timed"] = round(row["kernel_ms"] / row["timed_ms"], 3) if row["timed_ms"] else None
    row["tile"] = "x".join(map(str, tiles(c.in_channels, c.out_channels)))
    if c.groups == 1 and other_tiles:  # the dense kernel at other tiles: which would serve this layer best
        row["kernel_ms_by_tile"] = {
            "x".join(map(str, t)): round(gpu_ms(lambda t=t: conv1d_tm(xx, taps, k, d, tile=t), xx.device, iters), 4)
            for t in other_tiles
        }
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1.7b", help="preset whose codec to build (the codec is the same for all sizes)")
    ap.add_argument("--shapes", default="1x1,16x4,16x12,64x12,64x24", help="codec calls, ROWSxFRAMES")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument(
        "--tiles",
        default="64x128x32,128x128x64,128x64x32,64x64x64,256x64x32",
        help="other BLOCK_MxBLOCK_NxBLOCK_K of the dense kernel to time at each layer ('' for none)",
    )
    ap.add_argument("--smoke", action="store_true", help="tiny codec on the CPU, 1 iteration, fp32")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    cuda = torch.cuda.is_available() and not args.smoke
    dev = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    size, iters = ("tiny", 1) if args.smoke else (args.size, args.iters)
    shapes = [tuple(int(v) for v in s.split("x")) for s in ("1x1,2x2" if args.smoke else args.shapes).split(",")]
    others = [(int(a), int(b), int(c)) for a, b, c in (t.split("x") for t in args.tiles.split(",") if t)]
    if args.smoke:
        others = others[:1]
    torch.manual_seed(0)
    codec = CodecDecoder(preset(size).codec).to(dev)
    with torch.no_grad():
        for p in codec.parameters():
            p.normal_(0, 0.02)
    codec.to(dtype).prepare(kernels=cuda)
    res: dict[str, Any] = {
        "what": "the codec's convs of k > 1 alone, ms a call: cuDNN timed per shape, cuDNN heuristics, kernels/conv1d.py",
        "command": " ".join([sys.executable, *sys.argv]),
        "device": torch.cuda.get_device_name() if cuda else "cpu (smoke: not a speed)",
        "dtype": str(dtype).removeprefix("torch."),
        "shapes": {},
    }
    with torch.no_grad():
        for rows, frames in shapes:
            layers = [bench_layer(m, xx, iters, others) for m, xx in record_inputs(codec, rows, frames, seed=rows)]
            total = {v: round(sum(r[v] for r in layers), 3) for v in ("timed_ms", "heuristic_ms", "kernel_ms")}
            total["cudnn_timing_s"] = round(sum(r["cudnn_timing_s"] for r in layers), 2)
            res["shapes"][f"{rows}x{frames}"] = {"total": total, "layers": layers}
            print(f"[conv {rows}x{frames}] {total}", flush=True)
            Path(args.out).write_text(json.dumps(res, indent=1) + "\n")  # each shape kept if a later one times out


if __name__ == "__main__":
    main()
