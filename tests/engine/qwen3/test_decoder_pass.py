"""The persistent code-predictor pass (kernels/decoder_pass.py) against the chain of fused kernels it
replaces for one stream (fused_decode.py, itself checked against the unfused layers): the same logits
and the same K/V cache, for the first pass (two rows: the talker's hidden state and codebook 0) and a
later pass (one row, looked up in a codebook table).

CPU: the Triton interpreter on tiny models in fp32 (one program, the barriers drop out). GPU: the real
1.7B shapes in bf16, one program per SM with the grid barriers, eager and inside a CUDA graph.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, cast

import pytest
import torch
from torch import nn

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import engine.qwen3 as qwen3
from engine.qwen3 import ServeOptions, load_qwen3
from engine.qwen3.config import preset
from engine.qwen3.fused_decode import FusedDecode
from kernels.decoder_pass import decoder_pass


def _fused(size: str, device: str, dtype: str) -> FusedDecode:
    """The fused decode of a random model; "tiny-ffn48" is the tiny one with a 48-wide MLP, whose gate|up
    bands and down rows split into two tiles (32 + 16) as the 1.7B ones do on the H200."""
    opts = ServeOptions(
        max_slots=2,
        max_batch_size=2,
        max_seq_len=64,
        fused_kernels=True,
        fused_single_stream_pass=True,
        cuda_graphs=False,
    )
    with pytest.MonkeyPatch.context() as mp:
        if size == "tiny-ffn48":
            cfg = preset("tiny")
            cfg = replace(cfg, code_predictor=replace(cfg.code_predictor, intermediate_size=48))
            mp.setattr(qwen3, "preset", lambda *_: cfg)
        model = load_qwen3(
            None, size.removesuffix("-ffn48"), device=device, dtype=dtype, seed=3, options=opts
        )
    fused = model.step.fused
    assert fused is not None and fused.pass_weights is not None
    return fused


def _chain(
    fused: FusedDecode, x: torch.Tensor, pass_index: int, k: torch.Tensor, v: torch.Tensor
) -> torch.Tensor:
    """One pass of one stream on the kernel chain (fused_decode.predict's loop body) -> logits (1, V)."""
    rows = fused.rows(1)
    if pass_index == 0:
        h, slots, pos, lengths = fused._project(x), rows.pairs, rows.pair_positions, rows.pair_lengths
        plan = rows.predictor_pair_plan
    else:
        h, slots, plan = x, rows.index, rows.predictor_plan
        pos, lengths = rows.pass_positions[pass_index + 1], rows.pass_lengths[pass_index + 1]
    for i, w in enumerate(fused.cp_layers):
        h = fused._layer(w, h, slots, pos, lengths, k[i], v[i], fused.cp_freqs, plan)
    norm = fused.cp.norm
    return fused._linear(h[-1:], fused.cp_heads[pass_index], norm.weight, norm.eps, logits=True)


def _compare(fused: FusedDecode, tol: float, staging: str, graph: bool = False) -> None:
    cfg, dev, dtype = fused.cp.cfg, fused.kv.k.device, fused.kv.k.dtype
    g = torch.Generator().manual_seed(7)
    shape = (len(fused.cp_layers), 1, cfg.num_kv_heads, fused.cp_positions, cfg.head_dim)
    k, v, k_pass, v_pass = (torch.zeros(shape, device=dev, dtype=dtype) for _ in range(4))
    first = torch.randn(2, fused.talker.codec_embedding.weight.shape[1], generator=g).to(dev, dtype)
    code = torch.randint(0, cfg.vocab_size, (1,), generator=g).to(dev)
    table = cast(nn.Embedding, fused.cp.codec_embedding[0]).weight
    assert fused.pass_weights is not None
    run: dict[str, Any] = {
        "weights": fused.pass_weights,
        "k_cache": k_pass,
        "v_cache": v_pass,
        "counter": fused.pass_counter,
        "pdl": fused.pdl,
        "staging": staging,
    }

    def by_pass() -> tuple[torch.Tensor, torch.Tensor]:
        a = decoder_pass(first, head=fused.cp_heads[0], pos0=0, **run)
        return a, decoder_pass(table, head=fused.cp_heads[1], pos0=2, index=code, **run)

    want = (_chain(fused, first, 0, k, v), _chain(fused, fused._embed_project(table, code), 1, k, v))
    if graph:
        by_pass()  # compiled outside the capture
        gr = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr):
            got = by_pass()
        k_pass.zero_()
        v_pass.zero_()
        gr.replay()
        torch.cuda.synchronize()
    else:
        got = by_pass()

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.double() - b.double()).norm() / b.double().norm())

    for i in range(2):
        assert got[i].dtype == torch.float32 and got[i].shape == (1, cfg.vocab_size)
        assert rel(got[i], want[i]) < tol, f"pass {i} logits: {rel(got[i], want[i]):.2e}"
        if dtype == torch.float32:
            assert torch.equal(got[i].argmax(-1), want[i].argmax(-1))
    written = slice(0, 3)  # positions 0, 1 (the first pass) and 2 (the second)
    assert rel(k_pass[:, :, :, written], k[:, :, :, written]) < tol
    assert rel(v_pass[:, :, :, written], v[:, :, :, written]) < tol
    assert not k_pass[:, :, :, 3:].any()  # nothing written past the passes' positions


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU interpreter case; the GPU has its own")
@pytest.mark.parametrize("staging", ["registers", "l2"])
@pytest.mark.parametrize("size", ["tiny", "tiny-ffn48"])
def test_pass_matches_the_kernel_chain_in_fp32(size: str, staging: str) -> None:
    _compare(_fused(size, "cpu", "fp32"), tol=1e-5, staging=staging)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "staging,graph", [("registers", False), ("l2", False), ("registers", True), ("l2", True)]
)
def test_pass_matches_the_kernel_chain_at_real_size(staging: str, graph: bool) -> None:
    _compare(_fused("1.7b", "cuda", "bf16"), tol=2e-2, staging=staging, graph=graph)


@pytest.mark.skipif(torch.cuda.is_available(), reason="argument checks run once, on the CPU interpreter")
def test_bad_arguments_are_refused() -> None:
    fused = _fused("tiny", "cpu", "fp32")
    cfg, w = fused.cp.cfg, fused.pass_weights
    assert w is not None
    hidden = fused.talker.codec_embedding.weight.shape[1]
    k = torch.zeros(len(fused.cp_layers), 1, cfg.num_kv_heads, 16, cfg.head_dim)
    x = torch.zeros(2, hidden)
    run: dict[str, Any] = {"weights": w, "head": fused.cp_heads[0], "counter": fused.pass_counter}
    caches = {"k_cache": k, "v_cache": k.clone()}
    with pytest.raises(ValueError, match="1 or 2 input rows"):
        decoder_pass(torch.zeros(3, hidden), pos0=0, **run, **caches)
    with pytest.raises(ValueError, match="outside the cache"):
        decoder_pass(x, pos0=15, **run, **caches)
    with pytest.raises(ValueError, match="caches must be"):
        decoder_pass(x, pos0=0, k_cache=k[:, :, :1], v_cache=k[:, :, :1], **run)
    with pytest.raises(TypeError, match="index"):
        decoder_pass(x, pos0=3, index=torch.zeros(1), **run, **caches)
    with pytest.raises(ValueError, match="staging"):
        decoder_pass(x, pos0=0, staging="smem", **run, **caches)
    with pytest.raises(TypeError, match="share"):
        decoder_pass(x.double(), pos0=0, **run, **caches)
