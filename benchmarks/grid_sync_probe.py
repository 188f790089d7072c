"""What a grid barrier costs against a kernel boundary, on a chain of dependent M = 1 linears (GPU).

    python3 benchmarks/grid_sync_probe.py --out probe.json

The code predictor's pass is a chain of ~33 kernels of 4-12 MB each, and at M = 1 each costs ~5 us
whatever it reads (benchmarks/results/fused_h200/linear_m1_m64.json). A persistent kernel replaces
the kernel boundaries with grid barriers (kernels/grid_sync.py) and can pull the next phase's weights
into L2 before it waits. This probe times, on 20 distinct 2048 x 2048 bf16 matrices (8 MB each, 168 MB
in all, like one predictor pass), y_{i+1} = W_i y_i for 200 phases:
  barrier   the barrier alone (no work), per barrier
  persist   one persistent launch, a barrier between phases (and with the next band prefetched to L2)
  kernels   one fused_linear per phase in a CUDA graph (PDL + 128 KiB prefetch, and plain)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.fused_linear import fused_linear
from kernels.grid_sync import grid_barrier, grid_exit
from kernels.pdl import prefetch_l2


@triton.jit
def _barrier_only(counter_ptr, exit_ptr, n):
    p = tl.num_programs(0)
    for i in range(n):
        grid_barrier(counter_ptr, (i + 1) * p)
    grid_exit(counter_ptr, exit_ptr, p)


@triton.jit
def _chain(
    w_ptr,
    x_ptr,
    counter_ptr,
    exit_ptr,
    n_phases,
    n_mats,
    D: tl.constexpr,
    BN: tl.constexpr,
    PREFETCH: tl.constexpr,
    PIECES: tl.constexpr,
):
    pid = tl.program_id(0)
    p = tl.num_programs(0)
    bands = D // BN
    rk = tl.arange(0, D)
    rn = tl.arange(0, BN)
    if PREFETCH:
        for band in range(pid, bands, p):
            prefetch_l2(w_ptr + band * BN * D, BN * D, PIECES)
    for ph in range(n_phases):
        w = w_ptr + (ph % n_mats) * D * D
        if PREFETCH:
            w_next = w_ptr + ((ph + 1) % n_mats) * D * D
            for band in range(pid, bands, p):
                prefetch_l2(w_next + band * BN * D, BN * D, PIECES)
        xin = x_ptr + (ph % 2) * D
        xout = x_ptr + ((ph + 1) % 2) * D
        for band in range(pid, bands, p):
            rows = band * BN + rn
            wt = tl.load(w + rows[:, None] * D + rk[None, :]).to(tl.float32)
            xk = tl.load(xin + rk, cache_modifier=".cg").to(tl.float32)
            tl.store(xout + rows, tl.sum(wt * xk[None, :], axis=1).to(tl.bfloat16))
        grid_barrier(counter_ptr, (ph + 1) * p)
    grid_exit(counter_ptr, exit_ptr, p)


@triton.jit
def _chain_regs(w_ptr, x_ptr, counter_ptr, exit_ptr, n_phases, n_mats, D: tl.constexpr, BN: tl.constexpr):
    """One band per program (grid = D / BN); the next phase's band is loaded before the barrier."""
    pid = tl.program_id(0)
    p = tl.num_programs(0)
    rk = tl.arange(0, D)
    rows = pid * BN + tl.arange(0, BN)
    band = rows[:, None] * D + rk[None, :]
    wt = tl.load(w_ptr + band)
    for ph in range(n_phases):
        wn = tl.load(w_ptr + ((ph + 1) % n_mats) * D * D + band)
        xin = x_ptr + (ph % 2) * D
        xk = tl.load(xin + rk, cache_modifier=".cg").to(tl.float32)
        tl.store(
            x_ptr + ((ph + 1) % 2) * D + rows, tl.sum(wt.to(tl.float32) * xk[None, :], axis=1).to(tl.bfloat16)
        )
        grid_barrier(counter_ptr, (ph + 1) * p)
        wt = wn
    grid_exit(counter_ptr, exit_ptr, p)


def timed(fn, reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps * 1e3  # us per call


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--phases", type=int, default=200)
    args = ap.parse_args()
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    d, n_mats, phases = 2048, 20, args.phases
    w = (torch.randn(n_mats, d, d, device=dev) / d**0.5).to(torch.bfloat16)
    x = torch.randn(2, d, device=dev).to(torch.bfloat16)
    counter = torch.zeros(2, dtype=torch.int32, device=dev)
    res: dict[str, object] = {
        "device": torch.cuda.get_device_name(dev),
        "sms": sms,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "phases": phases,
        "matrix": [d, d],
        "mats": n_mats,
    }

    for programs in (sms, sms // 2, 64):
        us = timed(lambda: _barrier_only[(programs,)](counter, counter[1:], 1000, num_warps=4))
        res[f"barrier_us_{programs}p"] = us / 1000
        print(f"[barrier] {programs} programs: {us / 1000:.3f} us per barrier", flush=True)

    # reference: y after `phases` phases, from torch
    def reference() -> torch.Tensor:
        y = x[0].clone()
        for ph in range(phases):
            y = (w[ph % n_mats].float() @ y.float()).to(torch.bfloat16)
        return y

    ref = reference()
    for bn in (16, 8):
        for prefetch in (False, True):
            programs = min(sms, d // bn)
            xx = x.clone()

            def run() -> None:
                xx[0].copy_(x[0])
                _chain[(programs,)](
                    w,
                    xx,
                    counter,
                    counter[1:],
                    phases,
                    n_mats,
                    D=d,
                    BN=bn,
                    PREFETCH=prefetch,
                    PIECES=128,
                    num_warps=8,
                )

            run()
            torch.cuda.synchronize()
            err = (xx[phases % 2].float() - ref.float()).abs().max().item()
            us = timed(run, 10)
            key = f"persist_bn{bn}_{'prefetch' if prefetch else 'plain'}"
            res[key] = {"us_per_phase": us / phases, "max_abs_err": err, "programs": programs}
            print(f"[{key}] {us / phases:.2f} us per phase, err {err:.3g}, {programs} programs", flush=True)

    for bn, warps in ((16, 8), (16, 16), (32, 16)):
        programs = d // bn
        xx = x.clone()

        def run_regs() -> None:
            xx[0].copy_(x[0])
            _chain_regs[(programs,)](w, xx, counter, counter[1:], phases, n_mats, D=d, BN=bn, num_warps=warps)

        run_regs()
        torch.cuda.synchronize()
        err = (xx[phases % 2].float() - ref.float()).abs().max().item()
        us = timed(run_regs, 10)
        key = f"regs_bn{bn}_w{warps}"
        res[key] = {"us_per_phase": us / phases, "max_abs_err": err, "programs": programs}
        print(f"[{key}] {us / phases:.2f} us per phase, err {err:.3g}, {programs} programs", flush=True)

    for pdl, pf in ((True, 128 * 1024), (False, 0)):
        bufs = [x[0].clone().view(1, d), x[1].clone().view(1, d)]

        def chain() -> None:
            for ph in range(phases):
                fused_linear(bufs[ph % 2], w[ph % n_mats], out=bufs[(ph + 1) % 2], pdl=pdl, prefetch_bytes=pf)

        chain()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            chain()
        bufs[0].copy_(x[0].view(1, d))
        g.replay()
        torch.cuda.synchronize()
        err = (bufs[phases % 2].float().view(-1) - ref.float()).abs().max().item()
        us = timed(g.replay, 10)
        key = f"kernels_{'pdl' if pdl else 'plain'}"
        res[key] = {"us_per_phase": us / phases, "max_abs_err": err}
        print(f"[{key}] {us / phases:.2f} us per phase, err {err:.3g}", flush=True)
    res["hbm_floor_us_per_phase"] = d * d * 2 / 4.0e12 * 1e6
    Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
