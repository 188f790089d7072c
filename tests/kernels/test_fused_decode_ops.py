"""The fused decode-step kernels against the unfused engine code they replace (engine/qwen3/layers.py,
rope.py, sampler.py): fp32 must match to float rounding, bf16 (GPU) to bf16 rounding noise; the sampler
must pick the very same codes."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from tests.kernels.common import REL_TOL, rel_err, skip_unsupported
from voicewire.engine.qwen3.layers import rms_norm, silu_mul
from voicewire.engine.qwen3.rope import cos_sin, inv_freq, rotate
from voicewire.engine.qwen3.sampler import RowParams, apply_repetition_penalty, sample
from voicewire.kernels.fused_linear import (
    ACT_SILU,
    ACT_SILU_MUL,
    LinearConfig,
    fused_linear,
    rms_norm_rows,
    silu_mul_rows,
)
from voicewire.kernels.gemv import GemvConfig
from voicewire.kernels.qk_norm_rope import qk_norm_rope_store
from voicewire.kernels.sampling import sample_rows

EPS = 1e-6


def _dtypes(device: str) -> list[torch.dtype]:
    return [torch.float32] if device == "cpu" else [torch.float32, torch.bfloat16]


def _tol(dtype: torch.dtype) -> float:
    return 1e-5 if dtype == torch.float32 else REL_TOL[dtype]


# (M, N, K): a lone row, a ragged batch, the first code-predictor pass (2 rows per stream), K not a
# multiple of the K tile, batches past 64 rows (the wide tiles, a ragged last row block), and (GPU)
# the real 1.7B shapes at batch 1, 64, a loaded server's 256 and a prefill's 512 positions
CASES = [(1, 64, 32), (5, 48, 64), (6, 96, 48), (3, 40, 80), (70, 48, 64), (130, 40, 80)]
GPU_CASES = [
    (1, 4096, 2048),
    (64, 6144, 2048),
    (64, 2048, 6144),
    (2, 4096, 1024),
    (1, 1024, 3072),
    (2, 6144, 2048),
    (256, 2048, 6144),
    (256, 6144, 2048),
    (512, 1024, 3072),
    (130, 4096, 2048),
]


def _assert_every_form(
    lin: Callable[..., torch.Tensor],
    x: torch.Tensor,
    w: torch.Tensor,
    w2: torch.Tensor,
    norm_w: torch.Tensor,
    bias: torch.Tensor,
    res: torch.Tensor,
    table: torch.Tensor | None = None,
    index: torch.Tensor | None = None,
) -> None:
    """Each prologue / epilogue of ``lin`` (fused_linear, maybe with a config) against the unfused layer;
    with ``table``, the bias + SiLU case reads its rows as table[index] (x is table[index])."""
    src = x if table is None else table
    cases = {
        "plain": (lin(x, w), F.linear(x, w)),
        "norm": (lin(x, w, norm_weight=norm_w, eps=EPS), F.linear(rms_norm(x, norm_w, EPS), w)),
        "bias+silu": (lin(src, w, bias=bias, act=ACT_SILU, index=index), F.silu(F.linear(x, w, bias))),
        "norm+silu_mul": (
            lin(x, w2, norm_weight=norm_w, eps=EPS, act=ACT_SILU_MUL),
            silu_mul(F.linear(rms_norm(x, norm_w, EPS), w2)),
        ),
        "residual": (lin(x, w, residual=res), res + F.linear(x, w)),
        "norm, fp32 out": (
            lin(x, w, norm_weight=norm_w, eps=EPS, out_dtype=torch.float32),
            F.linear(rms_norm(x, norm_w, EPS), w).float(),
        ),
    }
    for name, (out, ref) in cases.items():
        assert out.shape == ref.shape and out.dtype == ref.dtype, name
        assert rel_err(out, ref) < _tol(x.dtype), (name, x.dtype, rel_err(out, ref))


@pytest.mark.parametrize("m,n,k", CASES + GPU_CASES)
def test_fused_linear_matches_the_unfused_layer(device: str, m: int, n: int, k: int) -> None:
    if device == "cpu" and n * k > 10_000:
        pytest.skip("real shapes run on the GPU only (the interpreter is slow)")
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    for dtype in _dtypes(device):
        skip_unsupported(device, dtype)

        def rand(*shape: int, scale: float = 1.0, dtype: torch.dtype = dtype) -> torch.Tensor:
            return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)

        x, w, w2 = rand(m, k), rand(n, k, scale=k**-0.5), rand(2 * n, k, scale=k**-0.5)
        _assert_every_form(fused_linear, x, w, w2, rand(k, scale=0.5) + 1, rand(n, scale=0.1), rand(m, n))


@pytest.mark.parametrize("m", [1, 2])
def test_the_one_and_two_row_kernel_matches_the_unfused_layer(device: str, m: int) -> None:
    """The GEMV path (rows <= GEMV_MAX_ROWS) with bands and K chunks smaller than the data: a ragged
    last band (N = 40), five K chunks with a ragged last one (K = 72), so chunks are loaded ahead, in
    flight and at the tail; every prologue / epilogue and the embedding lookup. bf16 on the GPU only:
    the interpreter truncates float32 -> bf16 where the GPU rounds to nearest."""
    g = torch.Generator().manual_seed(10 + m)
    n, k = 40, 72
    for dtype in _dtypes(device):

        def rand(*shape: int, scale: float = 1.0, dtype: torch.dtype = dtype) -> torch.Tensor:
            return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)

        table, w, w2 = rand(9, k), rand(n, k, scale=k**-0.5), rand(2 * n, k, scale=k**-0.5)
        norm_w, bias, res = rand(k, scale=0.5) + 1, rand(n, scale=0.1), rand(m, n)
        index = torch.tensor([5, 2][:m], device=device)
        for cfg in (None, GemvConfig(block_n=16, block_k=16, num_warps=4)):
            lin = functools.partial(fused_linear, config=cfg)
            _assert_every_form(lin, table[index], w, w2, norm_w, bias, res, table=table, index=index)
        with pytest.raises(ValueError, match="at most"):
            fused_linear(rand(3, k), w, config=GemvConfig(16, 16))


def test_fused_linear_reads_strided_rows_and_any_tile(device: str) -> None:
    """x as a view of every other row (h[:, -1] in the code predictor) and tiles smaller than the data."""
    g = torch.Generator().manual_seed(3)
    big = torch.randn(4, 2, 64, generator=g).to(device)
    x = big[:, -1]
    w = torch.randn(48, 64, generator=g).to(device) * 0.1
    cfg = LinearConfig(block_m=16, block_n=16, block_k=16, num_warps=1, num_stages=1)
    assert rel_err(fused_linear(x, w, config=cfg), F.linear(x, w)) < 1e-5


def test_fused_linear_gathers_its_rows_by_index(device: str) -> None:
    """index: row m of the input is table[index[m]] (the code predictor's embedding lookup), bit for bit."""
    g = torch.Generator().manual_seed(4)
    for dtype in _dtypes(device):
        table = torch.randn(50, 64, generator=g).to(device, dtype)
        w = (torch.randn(48, 64, generator=g) * 0.1).to(device, dtype)
        bias = torch.randn(48, generator=g).to(device, dtype)
        index = torch.tensor([7, 0, 49, 7, 3], device=device)
        got = fused_linear(table, w, bias=bias, index=index)
        torch.testing.assert_close(got, fused_linear(table[index], w, bias=bias), rtol=0, atol=0)
        got32 = fused_linear(table, w, index=index.to(torch.int32))
        torch.testing.assert_close(got32, fused_linear(table[index], w), rtol=0, atol=0)


@pytest.mark.gpu
def test_pdl_launches_give_the_same_bits() -> None:
    """Programmatic dependent launch with the L2 weight prefetch (kernels/pdl.py), eager and inside a
    CUDA graph, on the real 1.7B talker shapes: a chain of the kernels gives exactly the bits of the
    same chain launched plainly. A missing wait would read a half-written input."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    g = torch.Generator().manual_seed(6)
    dev, dtype = "cuda", torch.bfloat16

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * scale).to(dev, dtype)

    x0, ln = rand(4, 2048), rand(2048, scale=0.1) + 1
    w_gu, w_down, w_qkv = (
        rand(12288, 2048, scale=0.02),
        rand(2048, 6144, scale=0.02),
        rand(4096, 2048, scale=0.02),
    )

    def chain(pdl: bool) -> torch.Tensor:
        x = x0
        for _ in range(3):
            h = fused_linear(
                x, w_gu, norm_weight=ln, eps=EPS, act=ACT_SILU_MUL, pdl=pdl, prefetch_bytes=1 << 20
            )
            x = fused_linear(h, w_down, residual=x, pdl=pdl, prefetch_bytes=64 << 10)
            y = fused_linear(x, w_qkv, norm_weight=ln, eps=EPS, pdl=pdl, prefetch_bytes=128 << 10)
            x = x + silu_mul_rows(rms_norm_rows(y, ln[:1].expand(4096).contiguous(), EPS, pdl=pdl), pdl=pdl)
        return x

    plain = chain(False)
    torch.testing.assert_close(chain(True), plain, rtol=0, atol=0)
    graph = torch.cuda.CUDAGraph()
    chain(True)
    with torch.cuda.graph(graph):
        out = chain(True)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, plain, rtol=0, atol=0)


def test_norm_and_swiglu_row_kernels_match_the_layers(device: str) -> None:
    """The two helpers of the many-rows path (norm before cuBLAS, SwiGLU after it)."""
    g = torch.Generator().manual_seed(5)
    for dtype in _dtypes(device):
        x = torch.randn(6, 2, 80, generator=g).to(device, dtype)[:, 1]  # strided rows
        w = (torch.rand(80, generator=g) + 0.5).to(device, dtype)
        assert rel_err(rms_norm_rows(x, w, EPS), rms_norm(x, w, EPS)) < _tol(dtype) / 10
        gu = torch.randn(5, 2 * 1100, generator=g).to(device, dtype)  # F = 1100: two column blocks
        assert rel_err(silu_mul_rows(gu), silu_mul(gu)) < _tol(dtype) / 10


def test_fused_linear_rejects_bad_shapes() -> None:
    x, w = torch.zeros(2, 8), torch.zeros(4, 8)
    with pytest.raises(ValueError, match="columns"):
        fused_linear(x, torch.zeros(4, 9))
    with pytest.raises(ValueError, match="residual"):
        fused_linear(x, w, residual=torch.zeros(2, 5))
    with pytest.raises(ValueError, match="even"):
        fused_linear(x, torch.zeros(5, 8), act=ACT_SILU_MUL)
    with pytest.raises(TypeError):
        fused_linear(x, w.double())


@pytest.mark.parametrize("head_grid_rows", [1 << 20, 0], ids=["program-per-head", "program-per-row"])
@pytest.mark.parametrize("head_dim,q_heads,kv_heads", [(16, 4, 2), (16, 6, 3), (128, 16, 8)])
def test_qk_norm_rope_store_matches_norm_rotate_and_cache_write(
    device: str, head_dim: int, q_heads: int, kv_heads: int, head_grid_rows: int
) -> None:
    if device == "cpu" and head_dim > 16:
        pytest.skip("real shapes run on the GPU only")
    g = torch.Generator().manual_seed(head_dim)
    m, slots_n, max_len = 5, 7, 40
    for dtype in _dtypes(device):
        qkv = torch.randn(m, (q_heads + 2 * kv_heads) * head_dim, generator=g).to(device, dtype)
        qn = (torch.rand(head_dim, generator=g) + 0.5).to(device, dtype)
        kn = (torch.rand(head_dim, generator=g) + 0.5).to(device, dtype)
        freqs = inv_freq(head_dim, 1e6).to(device)
        slots = torch.tensor([3, 0, 6, 1, 6], dtype=torch.int32, device=device)
        positions = torch.tensor([0, 39, 17, 5, 18], dtype=torch.int32, device=device)
        k_cache = torch.zeros(slots_n, kv_heads, max_len, head_dim, device=device, dtype=dtype)
        v_cache = torch.zeros_like(k_cache)
        q = qk_norm_rope_store(
            qkv,
            qn,
            kn,
            freqs,
            k_cache,
            v_cache,
            slots,
            positions,
            q_heads=q_heads,
            eps=EPS,
            head_grid_rows=head_grid_rows,
        )

        nq, nkv = q_heads * head_dim, kv_heads * head_dim
        q_lin, k_lin, v_lin = qkv.split((nq, nkv, nkv), dim=-1)
        cos, sin = cos_sin(positions.long()[:, None], freqs)
        cos, sin = cos.to(dtype), sin.to(dtype)
        q_ref = rotate(rms_norm(q_lin.view(m, 1, q_heads, head_dim), qn, EPS).transpose(1, 2), cos, sin)
        k_ref = rotate(rms_norm(k_lin.view(m, 1, kv_heads, head_dim), kn, EPS).transpose(1, 2), cos, sin)
        tol = 1e-6 if dtype == torch.float32 else 1e-2
        assert rel_err(q, q_ref[:, :, 0]) < tol
        for r in range(m):
            s, p = int(slots[r]), int(positions[r])
            assert rel_err(k_cache[s, :, p], k_ref[r, :, 0]) < tol
            assert torch.equal(v_cache[s, :, p], v_lin[r].view(kv_heads, head_dim))
        written = {(int(s), int(p)) for s, p in zip(slots, positions, strict=True)}
        untouched = [(s, p) for s in range(slots_n) for p in range(max_len) if (s, p) not in written]
        assert all(not k_cache[s, :, p].any() and not v_cache[s, :, p].any() for s, p in untouched)


@pytest.mark.parametrize("head_grid_rows", [1 << 20, 0], ids=["program-per-head", "program-per-row"])
def test_qk_norm_rope_store_writes_through_the_block_table(device: str, head_grid_rows: int) -> None:
    # 8-position pages, blocks handed out in a shuffled order; row m's K/V lands at
    # [table[slot, pos // 8], :, pos % 8] and nowhere else (two rows of one slot on two pages).
    g = torch.Generator().manual_seed(3)
    head_dim, q_heads, kv_heads, page, num_blocks = 16, 4, 2, 8, 14
    m = 5
    for dtype in _dtypes(device):
        qkv = torch.randn(m, (q_heads + 2 * kv_heads) * head_dim, generator=g).to(device, dtype)
        qn = (torch.rand(head_dim, generator=g) + 0.5).to(device, dtype)
        kn = (torch.rand(head_dim, generator=g) + 0.5).to(device, dtype)
        freqs = inv_freq(head_dim, 1e6).to(device)
        table = (torch.randperm(num_blocks - 1, generator=g)[:12] + 1).view(3, 4).to(torch.int32).to(device)
        slots = torch.tensor([2, 0, 1, 0, 2], dtype=torch.int32, device=device)
        positions = torch.tensor([0, 31, 9, 8, 17], dtype=torch.int32, device=device)
        k_cache = torch.zeros(num_blocks, kv_heads, page, head_dim, device=device, dtype=dtype)
        v_cache = torch.zeros_like(k_cache)
        contiguous_k = torch.zeros(3, kv_heads, 4 * page, head_dim, device=device, dtype=dtype)
        contiguous_v = torch.zeros_like(contiguous_k)
        kw = {"q_heads": q_heads, "eps": EPS, "head_grid_rows": head_grid_rows}
        q = qk_norm_rope_store(qkv, qn, kn, freqs, k_cache, v_cache, slots, positions, block_table=table, **kw)
        q_flat = qk_norm_rope_store(qkv, qn, kn, freqs, contiguous_k, contiguous_v, slots, positions, **kw)
        assert torch.equal(q, q_flat)
        written = set()
        for r in range(m):
            s, p = int(slots[r]), int(positions[r])
            b = int(table[s, p // page])
            written.add((b, p % page))
            assert torch.equal(k_cache[b, :, p % page], contiguous_k[s, :, p])
            assert torch.equal(v_cache[b, :, p % page], contiguous_v[s, :, p])
        untouched = [(b, t) for b in range(num_blocks) for t in range(page) if (b, t) not in written]
        assert all(not k_cache[b, :, t].any() and not v_cache[b, :, t].any() for b, t in untouched)


def _slot_tables(n_slots: int, device: str) -> dict[str, torch.Tensor]:
    """Per-slot sampling rows covering greedy, top-k only, top-p only, both, and neither."""
    g = torch.Generator().manual_seed(11)
    greedy = torch.tensor([[i % 5 == 0, i % 7 == 0] for i in range(n_slots)])
    temperature = 0.5 + torch.rand(n_slots, 2, generator=g)
    top_k = torch.tensor([[[1, 5, 50, 10**9][i % 4], [50, 3, 10**9, 7][i % 4]] for i in range(n_slots)])
    top_p = torch.tensor(
        [[[1.0, 0.9, 0.5, 0.97][i % 4], [0.8, 1.0, 1.0, 0.6][(i + 1) % 4]] for i in range(n_slots)]
    )
    seed = torch.randint(0, 2**32, (n_slots,), generator=g)
    tables = {
        "greedy": greedy,
        "temperature": temperature,
        "top_k": top_k,
        "top_p": top_p.float(),
        "seed": seed,
    }
    return {k: v.to(device) for k, v in tables.items()}


@pytest.mark.parametrize("vocab,process", [(2048, False), (3072, True)])
def test_sampler_kernel_picks_the_reference_codes(device: str, vocab: int, process: bool) -> None:
    n_slots, rows = 24, 24
    tab = _slot_tables(n_slots, device)
    g = torch.Generator().manual_seed(vocab)
    slots = torch.randperm(n_slots, generator=g)[:rows].to(device)
    step = torch.randint(0, 500, (rows,), generator=g).to(device)
    logits = (torch.randn(rows, vocab, generator=g) * 3).to(device)
    seen = torch.rand(n_slots, vocab, generator=g).to(device) < 0.05
    penalty = torch.full((n_slots,), 1.05, device=device)
    eos_masked = (torch.arange(n_slots) % 2 == 0).to(device)
    suppress = torch.zeros(vocab, dtype=torch.bool, device=device)
    suppress[vocab - 1024 :] = True
    eos_id, min_frames = vocab - 1000, 200
    suppress[eos_id] = False
    logits[:, eos_id] += 10  # EOS would win wherever it is allowed

    col = 0 if process else 1
    scores = logits.clone()
    if process:
        scores = apply_repetition_penalty(scores, seen[slots], penalty[slots])
        no_eos = eos_masked[slots] | (step < min_frames)
        scores[:, eos_id] = torch.where(no_eos, float("-inf"), scores[:, eos_id])
        scores = scores.masked_fill(suppress, float("-inf"))
    params = RowParams(
        tab["greedy"][slots, col],
        tab["temperature"][slots, col],
        tab["top_k"][slots, col],
        tab["top_p"][slots, col],
        tab["seed"][slots],
        step,
    )
    ref = sample(scores, params, codebook=col + 3)

    seen_before = seen.clone()
    out = sample_rows(
        logits,
        slots.to(torch.int32),
        step,
        col,
        col + 3,
        process=(seen, penalty, eos_masked, suppress, eos_id, min_frames) if process else None,
        **tab,
    )
    assert out.tolist() == ref.tolist()
    if process:
        expect = seen_before.clone()
        expect[slots, ref] = True
        assert torch.equal(seen, expect)
        assert (out == eos_id).any() and not (out == eos_id).all(), "the case should exercise EOS masking"
