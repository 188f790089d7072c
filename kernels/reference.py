"""Plain-torch references for the kernels: obvious, fp32 math; ground truth for tests.

Each function takes exactly the arguments of its kernel and returns what the kernel must return. Loops
over rows are fine here: these run on tiny test shapes and once per benchmark shape as a cross-check,
never in serving; ``snake_reference`` alone, which loops over nothing, is also the codec's path
where Triton is not installed (this module needs torch only).
"""

from __future__ import annotations

from typing import NamedTuple

import torch


def softmax_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """Explicit masked softmax attention in fp32. q (H, Tq, D), k/v (H, Tk, D), mask (Tq, Tk) bool."""
    scores = torch.einsum("hqd,hkd->hqk", q.float(), k.float()) * scale  # (H, Tq, Tk)
    scores = scores.masked_fill(~mask, float("-inf"))
    # A query with no visible key gets 0, as the kernels do (length-0 padding rows).
    has_key = mask.any(dim=-1)  # (Tq,)
    probs = torch.softmax(scores.masked_fill(~has_key[:, None], 0.0), dim=-1) * has_key[:, None]
    return torch.einsum("hqk,hkd->hqd", probs, v.float())  # (H, Tq, D)


def paged_tokens(
    cache: torch.Tensor, block_table: torch.Tensor | None, slot: int, length: int
) -> torch.Tensor:
    """Tokens [0, length) of ``slot`` as (Hkv, length, D): cache (num_blocks, Hkv, PAGE, D), token t at
    [block_table[slot, t // PAGE], :, t % PAGE]; without a table the cache is slot-contiguous."""
    if block_table is None:
        return cache[slot, :, :length]
    page = cache.shape[2]
    blocks = block_table[slot, : -(-length // page)].long()
    return cache[blocks].permute(1, 0, 2, 3).flatten(1, 2)[:, :length]  # (Hkv, n_blocks x PAGE, D) cut


def decode_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_idx: torch.Tensor,
    lengths: torch.Tensor,
    *,
    scale: float,
    block_table: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reference for `kernels.decode_attention.decode_attention` (same layouts). Returns (B, Hq, D)."""
    batch, q_heads, _ = q.shape
    kv_heads = k_cache.shape[1]
    group = q_heads // kv_heads
    out = torch.empty_like(q)
    for row in range(batch):
        slot, length = int(slot_idx[row]), int(lengths[row])
        # GQA: query head i reads KV head i // group (what repeat_interleave and SDPA's enable_gqa do).
        k = paged_tokens(k_cache, block_table, slot, length)  # (Hkv, length, D)
        v = paged_tokens(v_cache, block_table, slot, length)
        k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)  # (Hq, length, D)
        mask = torch.ones((1, length), dtype=torch.bool, device=q.device)
        out[row] = softmax_attention(q[row, :, None], k, v, mask, scale)[:, 0].to(q.dtype)
    return out


def snake_reference(
    x: torch.Tensor,
    a: torch.Tensor,
    inv_b: torch.Tensor,
    shift: torch.Tensor | None = None,
    prefix: torch.Tensor | None = None,
    pair: bool = False,
) -> torch.Tensor:
    """``snake`` in torch ops (any device; the path without Triton), the same fp32 math and layouts."""
    v = x.float() + (0.0 if shift is None else shift)
    y = (v + inv_b * torch.sin(v * a).pow(2)).to(x.dtype)
    if pair:
        if prefix is None:
            raise ValueError("a pair needs the row before x as a (B, 1, C) prefix")
        return torch.cat((y, torch.cat((prefix, y[:, :-1]), dim=1)), dim=2)
    return y if prefix is None else torch.cat((prefix, y), dim=1)


# One opened slot's row in the packed step writes (kernels/slot_writes.py has the whole layout):
# slot | top_k x2 | seed | greedy x2 | eos_masked | whole_text | text_len | then the bits of the
# float32 temperature x2, top_p x2 and repetition penalty, each sign-extended from int32
OPEN_COLUMNS = 14


class SlotRows(NamedTuple):
    """The device rows the host writes between steps: per slot (N rows; V = the talker's vocabulary,
    W = the text queue's length) and the KV cache's block table, flat."""

    top_k: torch.Tensor  # (N, 2) int64
    seed: torch.Tensor  # (N,) int64
    greedy: torch.Tensor  # (N, 2) bool
    eos_masked: torch.Tensor  # (N,) bool
    whole_text: torch.Tensor  # (N,) bool
    temperature: torch.Tensor  # (N, 2) float32
    top_p: torch.Tensor  # (N, 2) float32
    penalty: torch.Tensor  # (N,) float32
    seen: torch.Tensor  # (N, V) bool, zeroed at an open
    first_feed_pending: torch.Tensor  # (N,) bool, zeroed at an open
    position: torch.Tensor  # (N,) int64, zeroed at an open
    frames: torch.Tensor  # (N,) int64, zeroed at an open
    text_len: torch.Tensor  # (N,) int64
    text: torch.Tensor  # (N, W) int64
    table: torch.Tensor  # (S * max_blocks,) int32


def slot_writes_reference(
    packed: torch.Tensor, opens: int, text: int, lens: int, table: int, rows: SlotRows
) -> None:
    """``slot_writes`` in torch ops (the path off CUDA), the same packed layout. An empty section
    runs none of its ops: most steps open no stream, and each op is host time a step."""
    if opens:
        row = packed[: OPEN_COLUMNS * opens].view(opens, OPEN_COLUMNS)
        at = row[:, 0]
        flags = row[:, 4:8].bool()
        floats = row[:, 9:14].to(torch.int32).view(torch.float32)
        rows.top_k.index_copy_(0, at, row[:, 1:3])
        rows.seed.index_copy_(0, at, row[:, 3])
        rows.greedy.index_copy_(0, at, flags[:, 0:2])
        rows.eos_masked.index_copy_(0, at, flags[:, 2])
        rows.whole_text.index_copy_(0, at, flags[:, 3])
        rows.text_len.index_copy_(0, at, row[:, 8])
        rows.temperature.index_copy_(0, at, floats[:, 0:2])
        rows.top_p.index_copy_(0, at, floats[:, 2:4])
        rows.penalty.index_copy_(0, at, floats[:, 4])
        for t in (rows.seen, rows.first_feed_pending, rows.position, rows.frames):
            t.index_fill_(0, at, 0)
    rest = packed[OPEN_COLUMNS * opens :]
    if text:
        rows.text.view(-1).index_copy_(0, rest[:text], rest[text : 2 * text])
    rest = rest[2 * text :]
    if lens:
        rows.text_len.index_copy_(0, rest[:lens], rest[lens : 2 * lens])
    rest = rest[2 * lens :]
    if table:
        rows.table.index_copy_(0, rest[:table], rest[table : 2 * table].to(rows.table.dtype))


__all__ = [
    "OPEN_COLUMNS",
    "SlotRows",
    "decode_attention_ref",
    "paged_tokens",
    "slot_writes_reference",
    "snake_reference",
    "softmax_attention",
]
