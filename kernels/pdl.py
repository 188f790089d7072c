"""Programmatic dependent launch (PDL, Hopper and later): a kernel starts while the one before it runs.

The frame step is a chain of ~700 dependent kernels of a few microseconds each. Without PDL the GPU
drains one grid completely before it launches and ramps up the next: a code-predictor linear takes
5-7 us to stream a 4-12 MB weight band that HBM delivers in 1-3 us (benchmarks/linear_bench.py;
docs/performance-history.md). With PDL, a kernel launched with ``launch_pdl=True`` may start as soon as every
program of its predecessor has released it. It then does the work that needs nothing the predecessor
writes (``prefetch_l2`` of its read-only weights), waits (``griddepcontrol.wait``: the predecessor has
finished and its writes are visible), releases its own successor, and runs.

Rules every kernel launched with PDL here keeps (``pdl_enter`` at its top does the last two):
  * before the wait it touches only read-only weights; every load of another kernel's output and every
    store comes after it;
  * every program waits, unconditionally: a kernel then finishes only after its predecessor has, so a
    kernel that reads the output of one two or more launches back is covered as well;
  * it releases its successor right after its own wait, so at most one kernel runs ahead of the chain.
A PDL kernel after an ordinary one (cuBLAS, a torch op) just starts when that one ends, and an ordinary
kernel after a PDL one waits for it as usual; CUDA-graph capture keeps these edges.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from voicewire.kernels.launch_checks import interpreter_enabled

# Bulk L2 prefetches need 16-byte aligned addresses and sizes.
PREFETCH_ALIGN_BYTES = 16


@functools.lru_cache(maxsize=16)
def _capability_major(device: torch.device) -> int:
    return torch.cuda.get_device_capability(device)[0]


def pdl_supported(device: torch.device) -> bool:
    """PDL runs on CUDA devices of compute capability 9.0 or later (not in the CPU interpreter)."""
    return device.type == "cuda" and not interpreter_enabled() and _capability_major(device) >= 9


def pdl_launch(pdl: bool, device: torch.device) -> dict[str, bool]:
    """A launcher's keywords: the kernel's ``USE_PDL`` constexpr and, when on, Triton's ``launch_pdl``."""
    if pdl and pdl_supported(device):
        return {"USE_PDL": True, "launch_pdl": True}
    return {"USE_PDL": False}


def prefetch_ok(weight: torch.Tensor) -> bool:
    """A contiguous weight whose rows start on 16-byte boundaries: a band of rows is one aligned range."""
    row_bytes = weight.stride(0) * weight.element_size()
    return (
        weight.is_contiguous()
        and weight.data_ptr() % PREFETCH_ALIGN_BYTES == 0
        and row_bytes % PREFETCH_ALIGN_BYTES == 0
    )


@triton.jit
def pdl_enter(USE_PDL: tl.constexpr):
    """Wait for the predecessor (its writes become visible), then let the successor launch."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def prefetch_l2(base_ptr, n_elements, PIECES: tl.constexpr):
    """Start pulling ``n_elements`` contiguous elements at ``base_ptr`` (16-byte aligned) into L2.

    One ``cp.async.bulk.prefetch`` per lane, each over 1/PIECES of the range; nothing waits for them:
    the loads that follow find the lines in L2, or in flight.
    """
    elem_bytes: tl.constexpr = base_ptr.dtype.element_ty.primitive_bitwidth // 8
    line: tl.constexpr = 128 // elem_bytes  # elements per 128-byte line
    piece = tl.cdiv(tl.cdiv(n_elements, PIECES), line) * line
    start = tl.arange(0, PIECES) * piece
    count = tl.minimum(tl.maximum(n_elements - start, 0), piece)
    size = ((count * elem_bytes) // 16 * 16).to(tl.int32)
    addr = (base_ptr + start).to(tl.int64)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r",
        [addr, size],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


__all__ = ["pdl_enter", "pdl_launch", "pdl_supported", "prefetch_l2", "prefetch_ok"]
