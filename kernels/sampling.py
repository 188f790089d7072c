"""One kernel per codebook for Qwen3-TTS sampling: logits processors, top-k, top-p and the draw, per row.

The torch sampler (engine/qwen3/sampler.py) is the reference and this kernel follows it exactly:

    talker rows (PROCESS):  repetition penalty over the slot's seen codes -> EOS masked when asked ->
                            suppressed ids -> and the drawn code is marked seen
    then, per row:          greedy -> argmax; else / temperature -> top-k -> top-p -> softmax ->
                            argmax(p / E), E ~ Exp(1) from the (seed, frame, codebook, token) hash

Unfused, that is two full sorts of the vocabulary per codebook (top-k, top-p) and ~40 elementwise
kernels; compiled it is still the sorts. Here one program owns one row and its whole vocabulary
(<= 4096 logits in registers); the k-th largest value and the top-p cut are found by bisection over the
order-preserving integer image of the float scores (32 rounds of a masked count / masked sum each), which
lands on exactly the value a sort would give. Ties at the top-p cut are kept together (a sort would keep
or drop tied tokens in its own order); with float scores such ties are measure-zero.

Per-row parameters are read from the slot-indexed state tables (column ``col``: 0 = talker, 1 = code
predictor), so the launch needs no gathers before it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from voicewire.kernels.launch_checks import check_index, check_same_device_unit_stride
from voicewire.kernels.pdl import pdl_enter, pdl_launch

# kernels may read module globals only as tl.constexpr
INT32_MIN = tl.constexpr(-(2**31))
INT32_MAX = tl.constexpr(2**31 - 1)
NEVER_KEY = tl.constexpr(-(2**31) - 1)  # below every float's key: padding lanes, cut tokens


@triton.jit
def _mix32(x):
    """lowbias32 on uint32 (sampler._mix32)."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def _ordered_key(s):
    """float32 -> int64 key with the same order (sign-magnitude to two's complement)."""
    bits = s.to(tl.int32, bitcast=True)
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64)


@triton.jit(do_not_specialize=["col", "codebook", "eos_id", "min_frames"])
def _sample_kernel(
    logits_ptr,
    out_ptr,
    slot_ptr,
    step_ptr,
    greedy_ptr,
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    seed_ptr,
    seen_ptr,
    penalty_ptr,
    eos_masked_ptr,
    suppress_ptr,
    stride_lm,
    stride_param,
    stride_seen,
    col,
    codebook,
    V,
    eos_id,
    min_frames,
    PROCESS: tl.constexpr,
    BLOCK_V: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_enter(USE_PDL)
    row = tl.program_id(0)
    v = tl.arange(0, BLOCK_V)
    in_vocab = v < V
    slot = tl.load(slot_ptr + row).to(tl.int64)
    step = tl.load(step_ptr + row)
    s = tl.load(logits_ptr + row * stride_lm + v, mask=in_vocab, other=float("-inf")).to(tl.float32)
    if PROCESS:
        seen = tl.load(seen_ptr + slot * stride_seen + v, mask=in_vocab, other=0).to(tl.int1)
        p = tl.load(penalty_ptr + slot)
        s = tl.where(seen, tl.where(s < 0, s * p, s / p), s)
        no_eos = (tl.load(eos_masked_ptr + slot) != 0) | (step < min_frames)
        s = tl.where((v == eos_id) & no_eos, float("-inf"), s)
        s = tl.where(tl.load(suppress_ptr + v, mask=in_vocab, other=1) != 0, float("-inf"), s)
    greedy_code = tl.argmax(s, axis=0)

    t = s / tl.load(temperature_ptr + slot * stride_param + col)
    key = tl.where(in_vocab, _ordered_key(t), NEVER_KEY)  # padding lanes sort below everything
    top_k = tl.minimum(tl.maximum(tl.load(top_k_ptr + slot * stride_param + col), 1), V)
    if top_k < V:
        # the largest threshold that still keeps >= k tokens is the k-th largest key (ties stay)
        lo = tl.full((), INT32_MIN, tl.int64)
        hi = tl.full((), INT32_MAX, tl.int64)
        for _ in range(32):
            mid = lo + (hi - lo + 1) // 2
            keep = tl.sum((key >= mid).to(tl.int32), axis=0) >= top_k
            lo = tl.where(keep, mid, lo)
            hi = tl.where(keep, hi, mid - 1)
        t = tl.where(key >= lo, t, float("-inf"))
        key = tl.where(key >= lo, key, NEVER_KEY)
    prob = tl.exp(t - tl.max(t, axis=0))
    prob = prob / tl.sum(prob, axis=0)
    top_p = tl.load(top_p_ptr + slot * stride_param + col)
    if top_p < 1.0:
        # drop the smallest tokens whose cumulative probability stays <= 1 - p: keep key >= the
        # smallest threshold whose mass at or below it exceeds 1 - p (the maximum always stays)
        cut = 1.0 - top_p
        lo = tl.full((), INT32_MIN, tl.int64)
        hi = tl.max(key, axis=0)
        for _ in range(32):
            mid = lo + (hi - lo) // 2
            over = tl.sum(tl.where(key <= mid, prob, 0.0), axis=0) > cut
            hi = tl.where(over, mid, hi)
            lo = tl.where(over, lo, mid + 1)
        t = tl.where(key >= hi, t, float("-inf"))
        prob = tl.exp(t - tl.max(t, axis=0))
        prob = prob / tl.sum(prob, axis=0)

    # Exp(1) noise from the counter hash: seed, then frame, then codebook, then the token index
    h = _mix32(tl.load(seed_ptr + slot).to(tl.uint32))
    h = _mix32(h ^ step.to(tl.uint32))
    h = _mix32(h ^ codebook.to(tl.uint32))
    r = _mix32(h + v.to(tl.uint32) * 0x9E3779B9)
    u = ((r >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
    drawn = tl.argmax(tl.where(in_vocab, prob / -tl.log(u), -1.0), axis=0)
    code = tl.where(tl.load(greedy_ptr + slot * stride_param + col) != 0, greedy_code, drawn)
    tl.store(out_ptr + row, code.to(tl.int64))
    if PROCESS:
        tl.store(seen_ptr + slot * stride_seen + code, 1)


def sample_rows(
    logits: torch.Tensor,
    slots: torch.Tensor,
    step: torch.Tensor,
    col: int,
    codebook: int,
    *,
    greedy: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seed: torch.Tensor,
    process: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, int] | None = None,
    out: torch.Tensor | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """Sample one code per row of ``logits`` (M, V) float32 -> (M,) int64.

    slots (M,) int32: each row's state row; step (M,) int64: its frame index. greedy (S, 2) bool,
    temperature / top_p (S, 2) float32, top_k (S, 2) int64, seed (S,) int64: the slot tables (slot_state.py),
    column ``col``. ``process`` = (seen (S, V) bool, penalty (S,) float32, eos_masked (S,) bool,
    suppress (V,) bool, eos_id, min_new_frames) applies the talker's processors first and marks each
    drawn code seen.
    """
    m, vocab = logits.shape
    if logits.dtype != torch.float32:
        raise TypeError(f"logits must be float32, got {logits.dtype}")
    check_index("slots", slots, m)
    if step.dtype != torch.int64 or step.shape != (m,):
        raise TypeError(f"step must be int64 ({m},), got {step.dtype} {tuple(step.shape)}")
    tables = {"greedy": greedy, "temperature": temperature, "top_k": top_k, "top_p": top_p}
    for name, t in tables.items():
        if t.dim() != 2 or t.stride() != greedy.stride():
            raise ValueError(f"{name} must be (S, 2) laid out like greedy, got {tuple(t.shape)} {t.stride()}")
    if out is None:
        out = torch.empty(m, device=logits.device, dtype=torch.int64)
    tensors = {"logits": logits, "out": out, "slots": slots, "step": step, "seed": seed, **tables}
    if process is not None:
        seen, penalty, eos_masked, suppress, eos_id, min_frames = process
        if seen.shape[1] != vocab or suppress.shape != (vocab,):
            raise ValueError(f"seen must be (S, {vocab}) and suppress ({vocab},)")
        tensors.update(seen=seen, penalty=penalty, eos_masked=eos_masked, suppress=suppress)
    else:
        seen, penalty, eos_masked, suppress, eos_id, min_frames = logits, logits, logits, logits, 0, 0
    check_same_device_unit_stride(tensors, logits.device)
    if m == 0:
        return out
    _sample_kernel[(m,)](
        logits,
        out,
        slots,
        step,
        greedy,
        temperature,
        top_k,
        top_p,
        seed,
        seen,
        penalty,
        eos_masked,
        suppress,
        logits.stride(0),
        greedy.stride(0),
        seen.stride(0),
        col,
        codebook,
        vocab,
        eos_id,
        min_frames,
        PROCESS=process is not None,
        BLOCK_V=triton.next_power_of_2(vocab),
        num_warps=4,
        **pdl_launch(pdl, logits.device),
    )
    return out


__all__ = ["sample_rows"]
