"""The frame step's decode work on fused Triton kernels: 6 launches per decoder layer (9 above 8 rows),
against ~20 for the unfused layers even after torch.compile.

    qkv  = rms_norm(x) @ Wqkv^T                       fused_linear (norm prologue)
    q    = rope(norm(q)); cache <- rope(norm(k)), v   qk_norm_rope_store (through the block table)
    a    = attention(q, cache[slot][:pos + 1])         decode_attention (+ a combine launch when split)
    x    = x + a @ Wo^T                               fused_linear (residual epilogue)
    g    = silu(n @ Wg^T) * (n @ Wu^T), n = norm(x)   fused_linear (norm prologue, SwiGLU epilogue)
    x    = x + g @ Wd^T                               fused_linear (residual epilogue)

The talker runs it over the paged KV cache (kv_cache.py: a block-table row per stream); the code
predictor over a 16-position cache made per frame, one page per stream (a trivial block table), its
first pass with two rows per stream (the talker's hidden state and codebook 0 at positions 0 and 1:
each row is a query with its own length, so the same decode kernel serves it).
Sampling is one kernel per codebook (kernels/sampling.py), reading the slot tables directly.

Above ``cublas_rows`` rows (8) the wide projections (q|k|v, gate|up, the heads) go to cuBLAS after a
one-kernel norm, with a one-kernel SwiGLU: the fused kernel's norm prologue and epilogue re-read x for
every band of W, which at 64 rows costs 2-2.5x cuBLAS's time (gate|up 34-40 us against 16 us,
benchmarks/linear_bench.py); at a few rows the fused kernel wins by the launches it saves. o and down
keep the fused residual epilogue up to ``residual_cublas_rows`` (128); above, cuBLAS's tiles beat the
decode-shaped ones (talker gate|up at 256 rows 21 us against 55 for the best fused tile), the residual
added in cuBLAS's epilogue (an in-place addmm). Each way is measured by benchmarks/serving_bench.py's step
variants fused-kernels / fused-cublas / fused-residual-fused (docs/performance-history.md).

The prompt's prefill runs on the same layers (``talker_prefill``): its B x T positions are rows of one
batch, each a query over its own slot's cache up to its position.

On sm_90+ every Triton kernel here is launched with programmatic dependent launch (kernels/pdl.py): the
next kernel launches while the current one runs, and a fused linear pulls the head of its weight band
into L2 before it waits for its input, so the chain of ~700 small kernels per frame overlaps each
kernel's ramp-up with the one before it. Linears of one or two rows (``gemv_rows``: every linear of a
B = 1 frame) go further: they load their weights into registers before the wait. The code predictor's
codebook-embedding lookup is folded into its projection (fused_linear's ``index``), which keeps each pass one unbroken chain of Triton kernels.

Everything is a fixed-shape device computation, like frame_step.py's eager body it replaces, and is
captured in the same CUDA graphs. Rounding follows the unfused layers, so on the CPU interpreter (fp32)
the fused and unfused steps give the same codes (tests/engine/qwen3/test_fused_decode.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from voicewire.kernels.decode_attention import decode_attention
from voicewire.kernels.decode_attention_plan import (
    DecodeAttentionPlan,
    contiguous_block_table,
    plan_decode_attention,
)
from voicewire.kernels.fused_linear import ACT_SILU_MUL, fused_linear, rms_norm_rows, silu_mul_rows
from voicewire.kernels.qk_norm_rope import HEAD_GRID_ROWS, qk_norm_rope_store
from voicewire.kernels.sampling import sample_rows

from .code_predictor import CodePredictor
from .config import Qwen3TTSConfig
from .kv_cache import PagedKVCache
from .layers import DecoderLayer
from .options import FusedSettings
from .slot_state import SlotState
from .talker import Talker


@dataclass(frozen=True)
class _Layer:
    """One decoder layer's tensors, as the kernels take them (views of the module's parameters)."""

    ln1: Tensor
    qkv: Tensor
    q_norm: Tensor
    k_norm: Tensor
    o: Tensor
    ln2: Tensor
    gate_up: Tensor
    down: Tensor
    eps: float
    q_heads: int
    scale: float

    @staticmethod
    def of(module: nn.Module) -> _Layer:
        layer = cast(DecoderLayer, module)
        attn, mlp = layer.self_attn, layer.mlp
        if attn.qkv is None or mlp.gate_up is None:
            raise ValueError("fused decode needs the fused q|k|v and gate|up weights (DecoderLayer.fuse())")
        return _Layer(
            layer.input_layernorm.weight,
            attn.qkv,
            attn.q_norm.weight,
            attn.k_norm.weight,
            attn.o_proj.weight,
            layer.post_attention_layernorm.weight,
            mlp.gate_up,
            mlp.down_proj.weight,
            layer.input_layernorm.eps,
            attn.heads,
            attn.head_dim**-0.5,
        )


@dataclass(frozen=True)
class _Rows:
    """Per-batch-size row metadata (int32, on the device), made once per bucket and reused every step."""

    index: Tensor  # (B,) 0..B-1: the code predictor's cache row of each stream
    pairs: Tensor  # (2B,) each stream's row twice: the predictor's two-token first pass
    pair_positions: Tensor  # (2B,) 0, 1, 0, 1, ...
    pair_lengths: Tensor  # (2B,) 1, 2, 1, 2, ...
    pass_positions: list[Tensor]  # [p] (B,) all p: the predictor's pass at position p
    pass_lengths: list[Tensor]  # [p] (B,) all p + 1
    predictor_table: Tensor  # (B, 1) the predictor cache's trivial block table: row r is block r
    talker_plan: DecodeAttentionPlan
    predictor_plan: DecodeAttentionPlan
    predictor_pair_plan: DecodeAttentionPlan


class FusedDecode:
    def __init__(
        self,
        cfg: Qwen3TTSConfig,
        talker: Talker,
        code_predictor: CodePredictor,
        kv: PagedKVCache,
        suppress: Tensor,
        settings: FusedSettings,
    ) -> None:
        self.cfg, self.talker, self.cp, self.kv = cfg, talker, code_predictor, kv
        self.talker_layers = [_Layer.of(m) for m in talker.layers]
        self.cp_layers = [_Layer.of(m) for m in code_predictor.layers]
        self.talker_freqs = talker.rope_freqs.to(torch.float32)
        self.cp_freqs = code_predictor.rope_freqs.to(torch.float32)
        self.cp_positions = cfg.talker.num_code_groups  # 16: hidden state + codebooks 0..14
        proj = code_predictor.small_to_mtp_projection
        self.proj = cast(nn.Linear, proj) if isinstance(proj, nn.Linear) else None
        self.cp_heads = torch.stack([cast(nn.Linear, h).weight for h in code_predictor.lm_head])  # (15, V, H)
        self.suppress = suppress  # (vocab,) bool: the talker's control ids (frame_step.py)
        self.cublas_rows, self.pdl = settings.cublas_rows, settings.pdl
        self.residual_cublas_rows, self.prefill = settings.residual_cublas_rows, settings.prefill
        self.prefetch_bytes, self.gemv_rows = settings.prefetch_bytes, settings.gemv_rows
        self._rows: dict[int, _Rows] = {}

    # --- the talker -------------------------------------------------------------------------------
    def talker_hidden(self, x: Tensor, slots32: Tensor, positions: Tensor) -> Tensor:
        """x (B, H) input embeddings of one token per slot (int32 slot ids) at ``positions`` (B,) int64
        -> final-norm hidden (B, H)."""
        x = self._talker_layers(x, slots32, positions.to(torch.int32))
        norm = self.talker.norm
        return rms_norm_rows(x, norm.weight, norm.eps, pdl=self.pdl)

    def talker_prefill(self, x: Tensor, slots: Tensor) -> None:
        """x (B, T, H) prompt inputs at positions 0 .. T - 1 of ``slots`` (B,): writes their KV.

        Each position is a row of its own, a query over its slot's cache up to itself: every layer
        stores the K/V of all rows before any row attends, so the decode kernels give causal attention
        over the prompt, at the tiles of a B x T-row batch instead of the unfused layers' launches."""
        b, t, h = x.shape
        positions = torch.arange(t, device=x.device, dtype=torch.int32).repeat(b)
        self._talker_layers(x.reshape(b * t, h), slots.to(torch.int32).repeat_interleave(t), positions)

    def _talker_layers(self, x: Tensor, slots32: Tensor, pos32: Tensor) -> Tensor:
        """x (M, H) one token per row at ``pos32`` (M,) of ``slots32`` (M,) -> the last layer's output."""
        plan = self.rows(x.shape[0]).talker_plan
        lengths = pos32 + 1
        for i, w in enumerate(self.talker_layers):
            x = self._layer(
                w,
                x,
                slots32,
                pos32,
                lengths,
                self.kv.k[i],
                self.kv.v[i],
                self.kv.block_table,
                self.talker_freqs,
                plan,
                x_owned=i > 0,  # the first layer's input is the caller's (the prefill reads it after)
            )
        return x

    def talker_logits(self, hidden: Tensor) -> Tensor:
        """(B, H) final-norm hidden -> (B, vocab) float32."""
        return self._linear(hidden, self.talker.codec_head.weight, None, 0.0, logits=True)

    def _linear(
        self, x: Tensor, weight: Tensor, norm: Tensor | None, eps: float, act: int = 0, logits: bool = False
    ) -> Tensor:
        """(norm(x) if norm else x) @ W^T, then SwiGLU or a float32 copy (logits): fused up to
        cublas_rows rows, else a norm kernel + cuBLAS + an activation kernel."""
        if x.shape[0] <= self.cublas_rows:
            out_dtype = torch.float32 if logits else None
            return self._fused(x, weight, norm_weight=norm, eps=eps, act=act, out_dtype=out_dtype)
        y = F.linear(rms_norm_rows(x, norm, eps, pdl=self.pdl) if norm is not None else x, weight)
        if act == ACT_SILU_MUL:
            return silu_mul_rows(y, pdl=self.pdl)
        return y.float() if logits else y

    def _residual(self, x: Tensor, weight: Tensor, residual: Tensor, owned: bool = True) -> Tensor:
        """residual + x @ W^T (o and down). Above residual_cublas_rows an ``owned`` residual (no one
        else reads it after) takes the sum in place: cuBLAS adds it in the GEMM's epilogue (beta = 1),
        one launch where a GEMM then an add are two."""
        if x.shape[0] <= self.residual_cublas_rows:
            return self._fused(x, weight, residual=residual)
        if owned:
            return residual.addmm_(x, weight.t())
        return residual + F.linear(x, weight)

    def _fused(self, x: Tensor, weight: Tensor, **kw: Any) -> Tensor:
        return fused_linear(
            x, weight, pdl=self.pdl, prefetch_bytes=self.prefetch_bytes, gemv_rows=self.gemv_rows, **kw
        )

    # --- sampling -----------------------------------------------------------------------------------
    def sample(self, logits: Tensor, st: SlotState, slots32: Tensor, frames: Tensor, codebook: int) -> Tensor:
        """Codebook 0 with the talker's processors (and its seen-mark), codebooks 1..15 plain."""
        process = None
        if codebook == 0:
            eos, min_frames = self.cfg.talker.codec_eos_id, self.cfg.generation.min_new_tokens
            process = (st.seen, st.penalty, st.eos_masked, self.suppress, eos, min_frames)
        return sample_rows(
            logits,
            slots32,
            frames,
            0 if codebook == 0 else 1,
            codebook,
            greedy=st.greedy,
            temperature=st.temperature,
            top_k=st.top_k,
            top_p=st.top_p,
            seed=st.seed,
            process=process,
            pdl=self.pdl,
        )

    # --- the code predictor ----------------------------------------------------------------------------
    def predict(
        self, hidden: Tensor, code0: Tensor, st: SlotState, slots32: Tensor, frames: Tensor
    ) -> Tensor:
        """hidden (B, H_talker) final-norm talker state, code0 (B,) -> codebooks 1..15 as (B, 15)."""
        b = hidden.shape[0]
        rows = self.rows(b)
        n_layers, cfg = len(self.cp_layers), self.cp.cfg
        shape = (n_layers, b, cfg.num_kv_heads, self.cp_positions, cfg.head_dim)
        k = torch.empty(shape, device=hidden.device, dtype=hidden.dtype)
        v = torch.empty_like(k)
        first = torch.stack((hidden, self.talker.codec_embedding(code0)), dim=1).view(2 * b, -1)
        h = self._project(first)
        for i, w in enumerate(self.cp_layers):
            h = self._layer(
                w,
                h,
                rows.pairs,
                rows.pair_positions,
                rows.pair_lengths,
                k[i],
                v[i],
                rows.predictor_table,
                self.cp_freqs,
                rows.predictor_pair_plan,
            )
        last = h.view(b, 2, -1)[:, 1]
        codes: list[Tensor] = []
        n = cfg.num_code_groups - 1
        for j in range(n):
            logits = self._linear(last, self.cp_heads[j], self.cp.norm.weight, self.cp.norm.eps, logits=True)
            code = self.sample(logits, st, slots32, frames, j + 1)
            codes.append(code)
            if j + 1 == n:
                break
            pos, lengths = rows.pass_positions[j + 2], rows.pass_lengths[j + 2]
            h = self._embed_project(cast(nn.Embedding, self.cp.codec_embedding[j]).weight, code)
            for i, w in enumerate(self.cp_layers):
                h = self._layer(
                    w,
                    h,
                    rows.index,
                    pos,
                    lengths,
                    k[i],
                    v[i],
                    rows.predictor_table,
                    self.cp_freqs,
                    rows.predictor_plan,
                )
            last = h
        return torch.stack(codes, dim=1)

    def _project(self, x: Tensor) -> Tensor:
        if self.proj is None:
            return x
        return self._fused(x, self.proj.weight, bias=self.proj.bias)

    def _embed_project(self, table: Tensor, codes: Tensor) -> Tensor:
        """project(table[codes]): the lookup folded into the projection's row loads (one launch)."""
        if self.proj is None:
            return F.embedding(codes, table)
        return self._fused(table, self.proj.weight, bias=self.proj.bias, index=codes)

    # --- shared -------------------------------------------------------------------------------------
    def _layer(
        self,
        w: _Layer,
        x: Tensor,
        slots: Tensor,
        positions: Tensor,
        lengths: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        block_table: Tensor,
        freqs: Tensor,
        plan: DecodeAttentionPlan,
        x_owned: bool = True,
    ) -> Tensor:
        """One decoder layer. ``x_owned``: x is this step's own (the layers may overwrite it), not
        a caller's input."""
        m = x.shape[0]
        qkv = self._linear(x, w.qkv, w.ln1, w.eps)
        q = qk_norm_rope_store(
            qkv,
            w.q_norm,
            w.k_norm,
            freqs,
            k_cache,
            v_cache,
            slots,
            positions,
            q_heads=w.q_heads,
            eps=w.eps,
            block_table=block_table,
            pdl=self.pdl,
            # the per-head grid is for a GPU's occupancy; in Triton's CPU interpreter (tests) every
            # program costs its ops' Python, so a row's heads go in one
            head_grid_rows=HEAD_GRID_ROWS if x.is_cuda else 0,
        )
        a = decode_attention(
            q,
            k_cache,
            v_cache,
            slots,
            lengths,
            block_table=block_table,
            scale=w.scale,
            plan=plan,
            pdl=self.pdl,
        )
        x = self._residual(a.view(m, -1), w.o, x, owned=x_owned)
        g = self._linear(x, w.gate_up, w.ln2, w.eps, ACT_SILU_MUL)
        return self._residual(g, w.down, x)

    def rows(self, b: int) -> _Rows:
        """Row metadata for batch ``b`` (made on first use: the eager warm-up runs before capture)."""
        r = self._rows.get(b)
        if r is None:
            dev, n = self.kv.k.device, self.cp_positions
            index = torch.arange(b, dtype=torch.int32, device=dev)
            kv_heads = self.kv.k.shape[2]  # (layers, num_blocks, Hkv, PAGE, D)
            pair_positions = torch.arange(2, dtype=torch.int32, device=dev).repeat(b)
            passes = [torch.full((b,), p, dtype=torch.int32, device=dev) for p in range(n + 1)]
            r = _Rows(
                index=index,
                pairs=index.repeat_interleave(2),
                pair_positions=pair_positions,
                pair_lengths=pair_positions + 1,
                pass_positions=passes[:n],
                pass_lengths=passes[1:],
                predictor_table=contiguous_block_table(b, dev),
                talker_plan=plan_decode_attention(b, kv_heads, self.kv.max_len, dev, self.kv.k.dtype),
                predictor_plan=plan_decode_attention(b, self.cp.cfg.num_kv_heads, n, dev, self.kv.k.dtype),
                predictor_pair_plan=plan_decode_attention(
                    2 * b, self.cp.cfg.num_kv_heads, n, dev, self.kv.k.dtype
                ),
            )
            self._rows[b] = r
        return r
