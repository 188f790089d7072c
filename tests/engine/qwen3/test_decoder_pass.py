"""The persistent code-predictor pass (kernels/decoder_pass.py) against the chain of fused kernels it
replaces (fused_decode.py, itself checked against the unfused layers): the same logits and the same
K/V cache, pass by pass, for the first pass's two rows per stream and a later pass's table lookup.

CPU: the Triton interpreter on the tiny model in fp32 (one program, the barriers drop out). GPU: the
real 1.7B shapes in bf16, one program per SM with the grid barriers, eager and inside a CUDA graph.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import cast

import pytest
import torch
from torch import nn

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from engine.qwen3 import ServeOptions, load_qwen3
from engine.qwen3.config import preset
from engine.qwen3.fused_decode import FusedDecode
from kernels.decoder_pass import decoder_pass


def _fused(size: str, device: str, dtype: str) -> FusedDecode:
    """The fused decode of a random ``size`` model; "tiny-ffn48" is the tiny one with a 48-wide MLP, whose
    gate|up bands and down rows split into two tiles (32 + 16) as the 1.7B ones do on the H200."""
    if size == "tiny-ffn48":
        import engine.qwen3 as qwen3

        cfg = preset("tiny")
        cfg = replace(cfg, code_predictor=replace(cfg.code_predictor, intermediate_size=48))
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(qwen3, "preset", lambda *_: cfg)
            return _fused_of("tiny", device, dtype)
    return _fused_of(size, device, dtype)


def _fused_of(size: str, device: str, dtype: str) -> FusedDecode:
    opts = ServeOptions(
        max_slots=4,
        max_batch_size=4,
        max_seq_len=64,
        fused_kernels=True,
        fused_pass_streams=4,
        cuda_graphs=False,
    )
    model = load_qwen3(None, size, device=device, dtype=dtype, seed=3, options=opts)
    assert model.step.fused is not None and model.step.fused.pass_weights is not None
    return model.step.fused


def _chain(
    fused: FusedDecode, inputs: torch.Tensor, pass_index: int, k: torch.Tensor, v: torch.Tensor
) -> torch.Tensor:
    """One pass on the kernel chain (fused_decode.predict's loop body) -> logits (B, V)."""
    b = k.shape[1]
    rows = fused.rows(b)
    if pass_index == 0:
        h, slots, pos, lengths, plan = (
            fused._project(inputs),
            rows.pairs,
            rows.pair_positions,
            rows.pair_lengths,
            rows.predictor_pair_plan,
        )
    else:
        h = inputs
        slots, pos, lengths = (
            rows.index,
            rows.pass_positions[pass_index + 1],
            rows.pass_lengths[pass_index + 1],
        )
        plan = rows.predictor_plan
    for i, w in enumerate(fused.cp_layers):
        h = fused._layer(w, h, slots, pos, lengths, k[i], v[i], fused.cp_freqs, plan)
    last = h.view(b, -1, h.shape[-1])[:, -1]
    return fused._linear(
        last, fused.cp_heads[pass_index], fused.cp.norm.weight, fused.cp.norm.eps, logits=True
    )


def _compare(fused: FusedDecode, streams: int, tol: float, graph: bool = False) -> None:
    cfg, dev = fused.cp.cfg, fused.kv.k.device
    dtype = fused.kv.k.dtype
    g = torch.Generator().manual_seed(streams)
    shape = (len(fused.cp_layers), streams, cfg.num_kv_heads, fused.cp_positions, cfg.head_dim)
    caches = [torch.zeros(shape, device=dev, dtype=dtype) for _ in range(4)]  # k, v: chain, then pass
    hidden_size = fused.talker.codec_embedding.weight.shape[1]
    first = torch.randn(2 * streams, hidden_size, generator=g).to(dev, dtype)
    codes = torch.randint(0, cfg.vocab_size, (streams,), generator=g).to(dev)
    table = cast(nn.Embedding, fused.cp.codec_embedding[0]).weight
    assert fused.pass_weights is not None

    def by_pass() -> tuple[torch.Tensor, torch.Tensor]:
        run = dict(
            weights=fused.pass_weights, k_cache=caches[2], v_cache=caches[3], counter=fused.pass_counter
        )
        a = decoder_pass(first, head=fused.cp_heads[0], pos0=0, rows_per_stream=2, pdl=fused.pdl, **run)
        b = decoder_pass(
            table, head=fused.cp_heads[1], pos0=2, rows_per_stream=1, index=codes, pdl=fused.pdl, **run
        )
        return a, b

    want0 = _chain(fused, first, 0, caches[0], caches[1])
    want1 = _chain(fused, fused._embed_project(table, codes), 1, caches[0], caches[1])
    if graph:
        by_pass()  # compile outside the capture
        gr = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr):
            got0, got1 = by_pass()
        for c in caches[2:]:
            c.zero_()
        gr.replay()
        torch.cuda.synchronize()
    else:
        got0, got1 = by_pass()

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.double() - b.double()).norm() / b.double().norm())

    for name, got, want in (("pass 0 logits", got0, want0), ("pass 1 logits", got1, want1)):
        assert got.dtype == torch.float32 and got.shape == (streams, cfg.vocab_size)
        assert rel(got, want) < tol, f"{name}: {rel(got, want):.2e}"
    written = slice(0, 3)  # positions 0, 1 (the first pass) and 2 (the second)
    for i, name in ((0, "k"), (1, "v")):
        assert rel(caches[2 + i][:, :, :, written], caches[i][:, :, :, written]) < tol, name
    if dtype == torch.float32:
        assert torch.equal(got0.argmax(-1), want0.argmax(-1)) and torch.equal(
            got1.argmax(-1), want1.argmax(-1)
        )


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU interpreter case; the GPU has its own")
@pytest.mark.parametrize("size,streams", [("tiny", 1), ("tiny", 3), ("tiny-ffn48", 2)])
def test_pass_matches_the_kernel_chain_in_fp32(size: str, streams: int) -> None:
    _compare(_fused(size, "cpu", "fp32"), streams, tol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("streams,graph", [(1, False), (3, False), (1, True)])
def test_pass_matches_the_kernel_chain_at_real_size(streams: int, graph: bool) -> None:
    _compare(_fused("1.7b", "cuda", "bf16"), streams, tol=2e-2, graph=graph)


@pytest.mark.skipif(torch.cuda.is_available(), reason="argument checks run once, on the CPU interpreter")
def test_bad_arguments_are_refused() -> None:
    fused = _fused("tiny", "cpu", "fp32")
    cfg, w = fused.cp.cfg, fused.pass_weights
    assert w is not None
    hidden = fused.talker.codec_embedding.weight.shape[1]
    k = torch.zeros(len(fused.cp_layers), 1, cfg.num_kv_heads, 16, cfg.head_dim)
    x = torch.zeros(2, hidden)
    run = dict(weights=w, head=fused.cp_heads[0], k_cache=k, v_cache=k.clone(), counter=fused.pass_counter)
    with pytest.raises(ValueError, match="rows_per_stream"):
        decoder_pass(x, pos0=0, rows_per_stream=3, **run)
    with pytest.raises(ValueError, match="outside the cache"):
        decoder_pass(x, pos0=15, rows_per_stream=2, **run)
    with pytest.raises(ValueError, match="caches must be"):
        decoder_pass(torch.zeros(4, hidden), pos0=0, rows_per_stream=2, **run)
    with pytest.raises(TypeError, match="index"):
        decoder_pass(x, pos0=3, rows_per_stream=1, index=torch.zeros(1), **run)
    with pytest.raises(TypeError, match="share"):
        decoder_pass(x.double(), pos0=0, rows_per_stream=2, **run)
