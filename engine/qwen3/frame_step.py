"""One frame step of Qwen3-TTS on the device, for a fixed batch of slots: the bodies CUDA graphs capture.

    prefill: packed prompts (B, 2T + 4) of n <= T + 1 positions -> embedded (B, T + 1, H) -> talker over
             positions 0 .. T - 1 (KV of 0 .. n - 2 kept) -> the input of position n - 1 stored as the
             slot's first feed, its position set to n - 1; no logits, no sampling
    attach:  the same for a prompt whose positions 0 .. n - 2 are a kept prefix (prefix_cache.py):
             their KV copied in, no talker
    decode:  slots (B,) -> last frame + next text token (from the slot's device text queue), or the
             first feed of a slot just prefilled -> talker one-token step (KV written and attended in
             place) -> sample codebook 0 -> code predictor's 15 passes, each sampled -> codes (B, 16);
             position, frame count, last frame and repetition history advanced in the slot rows

So a stream's first frame comes out of the decode step that runs right after its prefill, beside the
frames of the running streams: the sampling tail, whose 15 code-predictor passes are a latency chain
that costs about as much for 8 rows as for 256, runs once per tick, not again for the new streams.
The first frame is the one a prefill over all n positions would sample: position n - 1 gets the same
input, frame count 0, the same seen-marks and EOS mask.

Everything here reads and writes device tensors only (slot_state.py): no host value, no sync, no
Python branch on data, and fixed shapes for a fixed batch; so the same code runs eagerly on the CPU
(the tests) and as a captured graph per batch bucket on CUDA (cuda_graphs.py). Rows of a bucket that
no stream uses carry the padding slot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor, nn

from .code_predictor import CodePredictor
from .config import Qwen3TTSConfig
from .kv_cache import PagedKVCache
from .options import FusedSettings
from .sampler import RowParams, apply_repetition_penalty, sample
from .slot_state import SlotState
from .talker import Talker

if TYPE_CHECKING:
    from .fused_decode import FusedDecode

NO_CODEC = -1  # packed prefill rows: "no codec-track id at this position"


def pack_prefill_row(
    text_ids: list[int], codec_ids: list[int | None], slot: int, positions: int
) -> list[int]:
    """One prompt of n <= ``positions`` + 1 ids as a row of the prefill input over ``positions`` talker
    positions: text | codec | n | slot, each track padded to ``positions`` + 1 ids (the last one fed by
    the decode step)."""
    n, width = len(text_ids), positions + 1
    if not 1 <= n <= width:
        raise ValueError(f"a prompt of {n} positions in a prefill row of {positions} talker positions")
    codec = [NO_CODEC if c is None else c for c in codec_ids]
    return [*text_ids, *([0] * (width - n)), *codec, *([NO_CODEC] * (width - n)), n, slot]


class FrameStep:
    def __init__(
        self,
        cfg: Qwen3TTSConfig,
        talker: Talker,
        code_predictor: CodePredictor,
        kv: PagedKVCache,
        state: SlotState,
        use_attention_kernel: bool,
        fused: FusedSettings | None = None,
    ) -> None:
        self.cfg, self.talker, self.code_predictor = cfg, talker, code_predictor
        self.kv, self.state, self.use_kernel = kv, state, use_attention_kernel
        t = cfg.talker
        dev = state.position.device
        self.suppress = torch.zeros(t.vocab_size, dtype=torch.bool, device=dev)
        self.suppress[list(t.suppressed_ids)] = True
        # code-predictor codebook tables stacked once: (15, vocab, H) for one gather per feed
        self.cp_tables = torch.stack([cast(nn.Embedding, e).weight for e in code_predictor.codec_embedding])
        self.groups = torch.arange(t.num_code_groups - 1, device=dev)[None, :]  # (1, 15)
        self.sample = sample  # fused_ops.compile_sampler swaps in a compiled version
        # the decode work on fused Triton kernels (fused_decode.py): CUDA, or the CPU interpreter in tests
        self.fused: FusedDecode | None = None
        if fused is not None:
            from .fused_decode import FusedDecode

            self.fused = FusedDecode(cfg, talker, code_predictor, kv, self.suppress, fused)

    # --- the two bodies ---------------------------------------------------------------------------
    def prefill(self, packed: Tensor) -> Tensor:
        """packed (B, 2T + 4) int64 rows of ``pack_prefill_row`` -> first feeds (B, H) (see
        ``prefill_embeddings``)."""
        width = (packed.shape[1] - 2) // 2  # T + 1 ids per track
        text, codec = packed[:, :width], packed[:, width : 2 * width]
        lengths, slots = packed[:, 2 * width], packed[:, 2 * width + 1]
        has_codec = (codec != NO_CODEC)[..., None]
        x = self.talker.embed_text(text) + self.talker.codec_embedding(codec.clamp(min=0)) * has_codec
        return self.prefill_embeddings(x, lengths, slots)

    def prefill_embeddings(self, x: Tensor, lengths: Tensor, slots: Tensor) -> Tensor:
        """x (B, T + 1, H) prompt inputs, right-padded; lengths (B,) n of each prompt -> first feeds (B, H).

        Writes KV of positions 0 .. n - 2; the input of position n - 1 waits in the slot's first-feed
        row for the decode step (module docstring)."""
        b, t = x.shape[0], x.shape[1] - 1
        dev = x.device
        # right-padded rows write garbage KV from position n - 1 on; each position is rewritten by the
        # slot's own next step before any query can see it (attention admits keys <= position). The
        # hidden states are not needed: only the KV each layer writes.
        if t > 0 and self.fused is not None and self.fused.prefill:  # t is a shape: 0 when every prompt is 1
            self.fused.talker_prefill(x[:, :t], slots)
        elif t > 0:
            positions = torch.arange(t, device=dev).expand(b, t)
            mask = torch.ones(t, t, dtype=torch.bool, device=dev).tril()[None, None]
            self.talker(x[:, :t], positions, self.kv.prefill(slots, t), mask)
        return self.first_feed(slots, x[torch.arange(b, device=dev), lengths - 1], lengths - 1)

    def attach(self, packed: Tensor) -> Tensor:
        """packed (B, 5) int64 rows [text id, codec id, n - 1, slot, prefix] of prompts whose first
        n - 1 positions are a kept prefix (kv_cache.py ``load_prefix``): its KV copied into each
        slot's first block, the input of position n - 1 stored as the first feed, as ``prefill``
        leaves a prompt of n positions -> first feeds (B, H)."""
        text, codec, position, slots, prefix = packed.unbind(1)
        self.kv.load_prefix(slots, prefix)
        return self.first_feed(slots, self.talker.embed_text(text) + self.talker.codec_embedding(codec), position)

    def first_feed(self, slots: Tensor, feed: Tensor, position: Tensor) -> Tensor:
        """feed (B, H) waits in each slot's first-feed row for the decode step, at ``position`` (B,)."""
        st = self.state
        st.first_feed.index_copy_(0, slots, feed)
        st.first_feed_pending.index_fill_(0, slots, True)
        st.position.index_copy_(0, slots, position)
        st.rezero_padding()
        return feed

    def decode(self, slots: Tensor) -> Tensor:
        """slots (B,) int64 -> codes (B, 16) of each slot's next frame."""
        frames, hidden = self.talker_step(slots)
        return self.sample_tail(slots, frames, hidden)

    def talker_step(self, slots: Tensor) -> tuple[Tensor, Tensor]:
        """The talker part of ``decode``: slots (B,) -> (frames so far (B,), hidden (B, H))."""
        st, cfg = self.state, self.cfg
        pos = st.position[slots]  # (B,)
        frames = st.frames[slots]
        prev = st.last_codes[slots]  # (B, 16)
        # text token carried by this feed: token k = frames (streamed text; token 0 was in the prompt),
        # tts-eos once at the end of the text, tts-pad after it (and always after a whole-text prompt).
        n_text = st.text_len[slots]
        k = torch.where(st.whole_text[slots], n_text + 1, frames)
        queued = st.text[slots, k.clamp(0, st.max_text_tokens - 1)]
        eos = torch.full_like(k, cfg.tts_eos_id)
        pad = torch.full_like(k, cfg.tts_pad_id)
        text_id = torch.where(k < n_text, queued, torch.where(k == n_text, eos, pad))
        codec = torch.cat(
            (self.talker.codec_embedding(prev[:, :1]), self.cp_tables[self.groups, prev[:, 1:]]), dim=1
        ).sum(dim=1)  # (B, H): the sum of the last frame's 16 code embeddings
        x = codec + self.talker.embed_text(text_id)  # (B, H)
        # frame 0 of a slot just prefilled: its prompt's last position instead (frames is 0 there, so
        # the feed after it, frame 1's, carries text token 1 as above)
        first = st.first_feed_pending[slots]
        x = torch.where(first[:, None], st.first_feed[slots], x)
        st.first_feed_pending.index_fill_(0, slots, False)
        if self.fused is not None:
            hidden = self.fused.talker_hidden(x, slots.to(torch.int32), pos)
        else:
            kv = self.kv.decode_in_place(slots, pos, self.use_kernel)
            hidden = self.talker(x[:, None], pos[:, None], kv, None)[:, 0]  # the view masks by position
        st.position.index_copy_(0, slots, pos + 1)
        return frames, hidden

    # --- the shared tail ------------------------------------------------------------------------
    def sample_tail(self, slots: Tensor, frames: Tensor, hidden: Tensor) -> Tensor:
        """hidden (B, H) of each slot's last position -> codes (B, 16); slot rows advanced."""
        if self.fused is not None:
            return self._advance(slots, frames, self._fused_codes(slots, frames, hidden))
        st, t = self.state, self.cfg.talker
        logits = self.talker.logits(hidden)  # (B, V) float32
        scores = apply_repetition_penalty(logits, st.seen[slots], st.penalty[slots])
        # EOS masked for random weights / forced lengths, and in the first min_new_tokens frames
        no_eos = st.eos_masked[slots] | (frames < self.cfg.generation.min_new_tokens)
        scores[:, t.codec_eos_id] = torch.where(no_eos, float("-inf"), scores[:, t.codec_eos_id])
        scores = scores.masked_fill(self.suppress, float("-inf"))
        seed = st.seed[slots]

        def row(col: int) -> RowParams:
            return RowParams(
                st.greedy[slots, col],
                st.temperature[slots, col],
                st.top_k[slots, col],
                st.top_p[slots, col],
                seed,
                frames,
            )

        code0 = self.sample(scores, row(0), 0)
        cp_params = row(1)
        rest = self.code_predictor.predict(
            hidden, self.talker.codec_embedding(code0), lambda j, lg: self.sample(lg, cp_params, j)
        )
        st.seen.index_put_((slots, code0), torch.ones_like(code0, dtype=torch.bool))
        return self._advance(slots, frames, torch.cat((code0[:, None], rest), dim=1))

    def _fused_codes(self, slots: Tensor, frames: Tensor, hidden: Tensor) -> Tensor:
        """The same tail on the fused kernels: the sampler also marks code 0 seen."""
        assert self.fused is not None
        slots32 = slots.to(torch.int32)
        code0 = self.fused.sample(self.fused.talker_logits(hidden), self.state, slots32, frames, 0)
        rest = self.fused.predict(hidden, code0, self.state, slots32, frames)
        return torch.cat((code0[:, None], rest), dim=1)

    def _advance(self, slots: Tensor, frames: Tensor, codes: Tensor) -> Tensor:
        """codes (B, 16) become each slot's last frame; frame counts advance."""
        st = self.state
        st.last_codes.index_copy_(0, slots, codes)
        st.frames.index_copy_(0, slots, frames + 1)
        st.rezero_padding()
        return codes
