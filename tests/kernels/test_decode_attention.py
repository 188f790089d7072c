"""Decode attention kernel against its torch reference: lengths at tile edges, mixed lengths, splits,
scattered slots, poisoned cache memory, strided views, bad inputs; CUDA graphs and big shapes on the GPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from tests.kernels.common import REL_TOL, needs_interpreter, rel_err, skip_unsupported
from voicewire.kernels.decode_attention import decode_attention
from voicewire.kernels.decode_attention_plan import (
    DEFAULT_BLOCK_N,
    FP32_BLOCK_N,
    MIN_TOKENS_PER_SPLIT,
    plan_decode_attention,
)
from voicewire.kernels.reference import decode_attention_ref, paged_tokens

# The talker's attention (0.6B and 1.7B alike).
Q_HEADS, KV_HEADS, HEAD_DIM = 16, 8, 128
ALL_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]


def make_cache(
    num_slots: int,
    kv_heads: int,
    max_len: int,
    head_dim: int,
    slot_idx: list[int],
    lengths: list[int],
    dtype: torch.dtype,
    device: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random K/V where rows' slots hold data up to their length; NaN everywhere else (unused slots, past
    the length), so any read of memory the kernel must not touch shows up as NaN in the output."""
    k = torch.full((num_slots, kv_heads, max_len, head_dim), float("nan"), dtype=dtype, device=device)
    v = torch.full_like(k, float("nan"))
    for slot, length in zip(slot_idx, lengths, strict=True):
        k[slot, :, :length] = torch.randn(kv_heads, length, head_dim, dtype=dtype, device=device)
        v[slot, :, :length] = torch.randn(kv_heads, length, head_dim, dtype=dtype, device=device)
    return k, v


def run_case(
    device: str,
    dtype: torch.dtype,
    lengths: list[int],
    slot_idx: list[int],
    *,
    num_slots: int,
    max_len: int,
    q_heads: int = Q_HEADS,
    kv_heads: int = KV_HEADS,
    head_dim: int = HEAD_DIM,
    num_splits: int | None = None,
    max_len_bound: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(sum(lengths) + len(lengths))
    batch = len(lengths)
    q = torch.randn(batch, q_heads, head_dim, dtype=dtype, device=device)
    k, v = make_cache(num_slots, kv_heads, max_len, head_dim, slot_idx, lengths, dtype, device)
    slots = torch.tensor(slot_idx, dtype=torch.int32, device=device)
    lens = torch.tensor(lengths, dtype=torch.int32, device=device)
    bound = max_len if max_len_bound is None else max_len_bound
    plan = plan_decode_attention(batch, kv_heads, bound, device, dtype, num_splits=num_splits)
    out = torch.full_like(q, float("nan"))  # poisoned: every element must be written
    decode_attention(q, k, v, slots, lens, scale=head_dim**-0.5, plan=plan, out=out, check_bounds=True)
    ref = decode_attention_ref(q, k, v, slots, lens, scale=head_dim**-0.5)
    return out, ref


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=DTYPE_IDS)
def test_lengths_at_tile_edges_and_scattered_slots(device: str, dtype: torch.dtype) -> None:
    skip_unsupported(device, dtype)
    # 1 token; one short of, exactly, one past a 64-token tile (and 32-token fp32 tiles); odd lengths.
    lengths = [1, 63, 64, 65, 33, 130]
    slot_idx = [6, 0, 3, 9, 2, 7]  # out of order, with gaps: slots 1, 4, 5, 8 stay NaN
    out, ref = run_case(device, dtype, lengths, slot_idx, num_slots=10, max_len=160)
    assert rel_err(out, ref) < REL_TOL[dtype]


@pytest.mark.parametrize("num_splits", [2, 5])
def test_split_kv_with_empty_splits(device: str, num_splits: int) -> None:
    # The bound (320) spans all splits; rows of length 1 and 40 leave the later splits empty.
    lengths = [1, 40, 300, 257, 320]
    out, ref = run_case(
        device, torch.float16, lengths, [4, 1, 0, 3, 2], num_slots=5, max_len=320, num_splits=num_splits
    )
    assert rel_err(out, ref) < REL_TOL[torch.float16]


def test_long_context_auto_plan_splits(device: str) -> None:
    # One stream over a long context is exactly where splits must kick in (8 programs would idle the GPU).
    plan = plan_decode_attention(1, KV_HEADS, 1500, device, torch.float32)
    assert plan.num_splits > 1
    out, ref = run_case(device, torch.float32, [1500], [0], num_slots=1, max_len=1500)
    assert rel_err(out, ref) < REL_TOL[torch.float32]


def test_bound_below_cache_length(device: str) -> None:
    # The plan only covers max_len_bound tokens of a longer cache: rows at the bound are complete.
    out, ref = run_case(device, torch.float32, [200, 7], [1, 0], num_slots=2, max_len=512, max_len_bound=200)
    assert rel_err(out, ref) < REL_TOL[torch.float32]


@pytest.mark.parametrize(("q_heads", "kv_heads"), [(4, 4), (8, 2), (16, 2)])
def test_other_gqa_groups(device: str, q_heads: int, kv_heads: int) -> None:
    # MHA (group 1) and groups 4 and 8 (BLOCK_H 16, padded rows) with a small head_dim.
    out, ref = run_case(
        device,
        torch.float32,
        [5, 70],
        [1, 0],
        num_slots=2,
        max_len=80,
        q_heads=q_heads,
        kv_heads=kv_heads,
        head_dim=32,
    )
    assert rel_err(out, ref) < REL_TOL[torch.float32]


@pytest.mark.parametrize("num_splits", [1, 3])
def test_length_zero_padding_row_gives_zeros(device: str, num_splits: int) -> None:
    out, ref = run_case(
        device, torch.float32, [0, 90], [0, 1], num_slots=2, max_len=96, num_splits=num_splits
    )
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert rel_err(out[1], ref[1]) < REL_TOL[torch.float32]


def test_strided_q_and_out_views(device: str) -> None:
    torch.manual_seed(0)
    batch, lengths = 3, [9, 100, 64]
    # q as a (B, Hq, D) view of a head-major (Hq, B, D) buffer; out a slice of a wider buffer.
    q = torch.randn(Q_HEADS, batch, HEAD_DIM, device=device).transpose(0, 1)
    k, v = make_cache(3, KV_HEADS, 128, HEAD_DIM, [2, 0, 1], lengths, torch.float32, device)
    slots = torch.tensor([2, 0, 1], dtype=torch.int32, device=device)
    lens = torch.tensor(lengths, dtype=torch.int32, device=device)
    wide = torch.full((batch, Q_HEADS + 2, HEAD_DIM), float("nan"), device=device)
    out = wide[:, 1 : 1 + Q_HEADS]
    decode_attention(q, k, v, slots, lens, scale=0.1, max_len_bound=128, out=out)
    ref = decode_attention_ref(q, k, v, slots, lens, scale=0.1)
    assert rel_err(out, ref) < REL_TOL[torch.float32]
    assert wide[:, 0].isnan().all() and wide[:, -1].isnan().all()  # nothing written outside the view


def test_plan_shapes() -> None:
    for batch, bound in [(1, 1), (1, 2048), (16, 2048), (128, 2048), (3, 1000)]:
        plan = plan_decode_attention(batch, KV_HEADS, bound, "cpu")
        assert plan.tokens_per_split % plan.block_n == 0
        assert plan.num_splits * plan.tokens_per_split >= bound
        assert (plan.num_splits - 1) * plan.tokens_per_split < bound  # no split starts past the bound
        assert plan.num_splits == 1 or plan.tokens_per_split >= MIN_TOKENS_PER_SPLIT
    assert plan_decode_attention(128, KV_HEADS, 2048, "cpu").num_splits == 1  # enough programs already
    assert plan_decode_attention(1, KV_HEADS, 512, "cpu", torch.bfloat16).block_n == DEFAULT_BLOCK_N
    # no key tile wider than the longest row (the code predictor's 16 positions), never below tl.dot's 16
    assert plan_decode_attention(64, KV_HEADS, 16, "cpu", torch.bfloat16).block_n == 16
    assert plan_decode_attention(64, KV_HEADS, 3, "cpu", torch.bfloat16).block_n == 16


@needs_interpreter  # CPU tensors: on a CUDA machine the device check would speak first
def test_rejects_bad_inputs() -> None:
    q = torch.randn(2, Q_HEADS, HEAD_DIM)
    k = torch.randn(2, KV_HEADS, 64, HEAD_DIM)
    slots = torch.tensor([0, 1], dtype=torch.int32)
    lens = torch.tensor([3, 64], dtype=torch.int32)
    ok = {"scale": 0.1, "max_len_bound": 64}
    with pytest.raises(TypeError, match="lengths must be int32"):
        decode_attention(q, k, k, slots, lens.long(), **ok)
    with pytest.raises(TypeError, match="dtypes differ"):
        decode_attention(q.half(), k, k, slots, lens, **ok)
    with pytest.raises(ValueError, match="head_dim"):
        decode_attention(q[..., :64], k, k, slots, lens, **ok)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        decode_attention(q[:, :12], k, k, slots, lens, **ok)
    with pytest.raises(ValueError, match="stride 1"):
        strided = torch.randn(2, KV_HEADS, 64, 2 * HEAD_DIM)[..., ::2]  # same shape, stride(-1) == 2
        decode_attention(q, strided, strided, slots, lens, **ok)
    with pytest.raises(ValueError, match="plan or max_len_bound"):
        decode_attention(q, k, k, slots, lens, scale=0.1)
    with pytest.raises(ValueError, match="lengths"):
        decode_attention(q, k, k, slots, lens, scale=0.1, max_len_bound=32, check_bounds=True)
    with pytest.raises(ValueError, match="slot_idx"):
        decode_attention(q, k, k, slots + 1, lens, **ok, check_bounds=True)
    with pytest.raises(ValueError, match="num_splits"):
        plan_decode_attention(2, KV_HEADS, 64, "cpu", num_splits=0)


# --- the paged layout ------------------------------------------------------------------------------
def make_paged_cache(
    lengths: list[int],
    slot_idx: list[int],
    *,
    num_slots: int,
    page: int,
    max_blocks: int,
    dtype: torch.dtype,
    device: str,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A pool whose blocks are handed to the slots in a random order (a slot's pages are neither
    contiguous nor ascending); block 0 is the scratch block every unassigned entry points at. All
    memory a row must not read is NaN: other blocks, the scratch block, the tail of a last page."""
    g = torch.Generator().manual_seed(seed)
    need = {
        s: -(-max(n for r, n in zip(slot_idx, lengths, strict=True) if r == s) // page) for s in set(slot_idx)
    }
    num_blocks = 1 + sum(need.values()) + 3  # 3 blocks nobody owns
    order = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
    table = torch.zeros(num_slots, max_blocks, dtype=torch.int32)
    for s, n in need.items():
        table[s, :n] = torch.tensor([order.pop() for _ in range(n)], dtype=torch.int32)
    k = torch.full((num_blocks, KV_HEADS, page, HEAD_DIM), float("nan"), dtype=dtype)
    v = torch.full_like(k, float("nan"))
    for s in need:
        n = max(n for r, n in zip(slot_idx, lengths, strict=True) if r == s)
        for t in range(n):
            b = int(table[s, t // page])
            k[b, :, t % page] = torch.randn(KV_HEADS, HEAD_DIM, generator=g).to(dtype)
            v[b, :, t % page] = torch.randn(KV_HEADS, HEAD_DIM, generator=g).to(dtype)
    return k.to(device), v.to(device), table.to(device)


def run_paged_case(
    device: str,
    dtype: torch.dtype,
    lengths: list[int],
    slot_idx: list[int],
    *,
    page: int,
    max_blocks: int,
    num_splits: int | None = None,
    num_slots: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(len(lengths) + page)
    k, v, table = make_paged_cache(
        lengths, slot_idx, num_slots=num_slots or max(slot_idx) + 1, page=page,
        max_blocks=max_blocks, dtype=dtype, device=device, seed=sum(lengths),
    )  # fmt: skip
    q = torch.randn(len(lengths), Q_HEADS, HEAD_DIM, dtype=dtype, device=device)
    slots = torch.tensor(slot_idx, dtype=torch.int32, device=device)
    lens = torch.tensor(lengths, dtype=torch.int32, device=device)
    plan = plan_decode_attention(
        len(lengths), KV_HEADS, max_blocks * page, device, dtype, num_splits=num_splits
    )
    out = torch.full_like(q, float("nan"))
    decode_attention(
        q, k, v, slots, lens, block_table=table, scale=HEAD_DIM**-0.5, plan=plan, out=out, check_bounds=True
    )
    ref = decode_attention_ref(q, k, v, slots, lens, block_table=table, scale=HEAD_DIM**-0.5)
    return out, ref


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_paged_lengths_across_page_edges(device: str, dtype: torch.dtype, num_splits: int) -> None:
    skip_unsupported(device, dtype)
    # 64-token pages (the talker's): one token, a page less one, a page, a page and one, several pages;
    # fp32 runs 32-token tiles (two per page), the others 64 (one per page)
    lengths = [1, 63, 64, 65, 200, 0, 129]
    slot_idx = [5, 0, 3, 2, 1, 6, 4]
    out, ref = run_paged_case(device, dtype, lengths, slot_idx, page=64, max_blocks=5, num_splits=num_splits)
    assert torch.equal(out[5], torch.zeros_like(out[5]))  # the length-0 row
    assert rel_err(out, ref) < REL_TOL[dtype]


def test_paged_rows_sharing_a_slot_and_small_pages(device: str) -> None:
    # Rows of one slot at different lengths (the prefill's positions as rows), 32-token pages at fp32's
    # 32-token tiles, a split count that puts split edges inside pages.
    lengths = [1, 31, 32, 33, 95, 96, 97, 250]
    slot_idx = [0, 0, 0, 0, 1, 1, 1, 2]
    out, ref = run_paged_case(device, torch.float32, lengths, slot_idx, page=32, max_blocks=8, num_splits=5)
    assert FP32_BLOCK_N == 32
    assert rel_err(out, ref) < REL_TOL[torch.float32]


def test_paged_reference_reads_the_table() -> None:
    # The reference itself: a slot's tokens are its blocks in table order, cut at the length.
    cache = torch.arange(4 * 1 * 2 * 1, dtype=torch.float32).view(4, 1, 2, 1)  # 4 blocks of 2 tokens
    table = torch.tensor([[3, 1, 0]], dtype=torch.int32)
    assert paged_tokens(cache, table, 0, 3).flatten().tolist() == [6.0, 7.0, 2.0]


@needs_interpreter
def test_paged_rejects_a_page_that_splits_a_tile() -> None:
    q = torch.randn(1, Q_HEADS, HEAD_DIM)
    k = torch.zeros(4, KV_HEADS, 48, HEAD_DIM)  # 48-token pages under 32-token fp32 tiles
    table = torch.zeros(1, 2, dtype=torch.int32)
    one = torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="tiles"):
        decode_attention(q, k, k, one - 1, one, block_table=table, scale=0.1, max_len_bound=96)
    k = torch.zeros(4, KV_HEADS, 32, HEAD_DIM)
    with pytest.raises(ValueError, match="block_table"):  # a block past the pool
        decode_attention(
            q, k, k, one - 1, one, block_table=table + 9, scale=0.1, max_len_bound=64, check_bounds=True
        )


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [16, 64])
def test_talker_shapes_bf16_mixed_lengths(batch: int) -> None:
    torch.manual_seed(batch)
    lengths = torch.randint(1, 2049, (batch,)).tolist()
    slot_idx = torch.randperm(batch + 7)[:batch].tolist()
    out, ref = run_case("cuda", torch.bfloat16, lengths, slot_idx, num_slots=batch + 7, max_len=2048)
    assert rel_err(out, ref) < REL_TOL[torch.bfloat16]


@pytest.mark.gpu
def test_cuda_graph_replay_with_new_lengths() -> None:
    # The engine captures one graph per batch bucket with a plan for the bucket's length bound and replays
    # it as streams grow: replays must follow the lengths in the device tensor.
    torch.manual_seed(0)
    batch, max_len = 8, 1024
    q = torch.randn(batch, Q_HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(batch, KV_HEADS, max_len, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    slots = torch.arange(batch, dtype=torch.int32, device="cuda").flip(0)
    lens = torch.full((batch,), 1, dtype=torch.int32, device="cuda")
    plan = plan_decode_attention(batch, KV_HEADS, max_len, "cuda", torch.bfloat16)
    out = torch.empty_like(q)
    decode_attention(q, k, v, slots, lens, scale=0.088, plan=plan, out=out)  # compile before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode_attention(q, k, v, slots, lens, scale=0.088, plan=plan, out=out)
    for step in range(3):
        lens.copy_(torch.randint(1, max_len + 1, (batch,), dtype=torch.int32))
        q.copy_(torch.randn_like(q))
        graph.replay()
        ref = decode_attention_ref(q, k, v, slots, lens, scale=0.088)
        assert rel_err(out, ref) < REL_TOL[torch.bfloat16], step


@pytest.mark.gpu
def test_cuda_graph_replay_with_new_block_tables() -> None:
    # The talker's graphs capture the table's address: a replay must follow new lengths and new blocks
    # (streams growing into fresh pages, a closed stream's blocks handed to another in another order).
    torch.manual_seed(1)
    batch, page, max_blocks, num_blocks = 8, 64, 16, 200
    q = torch.randn(batch, Q_HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(num_blocks, KV_HEADS, page, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    table = torch.zeros(batch, max_blocks, dtype=torch.int32, device="cuda")
    slots = torch.arange(batch, dtype=torch.int32, device="cuda").flip(0)
    lens = torch.ones(batch, dtype=torch.int32, device="cuda")
    plan = plan_decode_attention(batch, KV_HEADS, max_blocks * page, "cuda", torch.bfloat16)
    out = torch.empty_like(q)
    kw = {"block_table": table, "scale": 0.088, "plan": plan, "out": out}
    decode_attention(q, k, v, slots, lens, **kw)  # compile before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode_attention(q, k, v, slots, lens, **kw)
    for step in range(3):
        table.copy_((torch.randperm(num_blocks - 1)[: batch * max_blocks] + 1).view(batch, max_blocks))
        lens.copy_(torch.randint(0, max_blocks * page + 1, (batch,), dtype=torch.int32))
        q.copy_(torch.randn_like(q))
        graph.replay()
        ref = decode_attention_ref(q, k, v, slots, lens, block_table=table, scale=0.088)
        assert rel_err(out, ref) < REL_TOL[torch.bfloat16], step
