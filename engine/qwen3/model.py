"""Qwen3-TTS-12Hz behind the engine's ``Model`` contract: batched streaming generation and decode.

Life of a slot (host side: ``_Slot``; device side: rows of tensors indexed by slot):

    open_slot   sampling parameters -> device rows; codec state row reset
    add_text    complete words -> token ids (tokenizer.TextStream)
    generate    NEW:     prefill the prompt (needs the first text token, or the end of the text;
                         with ``extra["whole_text"]`` all of the text, as the package's default
                         non-streaming mode)
                RUNNING: feed the last frame + the next text token (or tts-eos once, then tts-pad
                         after the end of the text); a stream whose next token has not arrived is
                         not ready: it waits rather than padding
                then, batched over all slots of the step: sample codebook 0, run the code
                predictor for codebooks 1..15, one device->host copy of the (B, 16) codes
    decode      frames -> PCM through the stateful streaming codec decoder, batched over slots
                that decode the same number of frames
    close_slot  forget the host state; device rows are overwritten by the next owner

One generate() call runs at most one talker forward per slot (a prefill or a one-token feed)
and produces at most one frame per slot. Per-step host work is O(batch) bookkeeping; the device
never waits on the host except for the one copy of the sampled codes.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import torch
from torch import Tensor, nn

from ..model import DecodeWork, GenerateResult, Model, ModelError, ModelInfo, StreamParams, TextGranularity
from .codec_state import CodecStatePool
from .config import Qwen3TTSConfig
from .kv_cache import SlotKVCache
from .prompt import Prompt, build_prompt
from .sampler import RowParams, apply_repetition_penalty, sample
from .tokenizer import TextStream, TextTokenizer
from .weights import Modules

CODEC_MODES = ("stateful", "windowed")


@dataclass(frozen=True)
class ServeOptions:
    """Serving knobs of one model instance (not part of the checkpoint)."""

    max_slots: int = 16  # streams held at once (KV + codec state rows)
    max_batch_size: int = 16  # slots per generate() call
    max_seq_len: int = 1536  # talker positions per slot: prompt (~10) + one per frame (~2 min of audio)
    codec_mode: str = "stateful"  # "stateful" | "windowed" (stateless re-decode, the reference path)
    windowed_left_context: int = 72  # frames re-decoded before each chunk in windowed mode
    random_frames_per_token: float = 3.0  # random weights: frames per text token when not forced

    def __post_init__(self) -> None:
        if self.codec_mode not in CODEC_MODES:
            raise ValueError(f"codec_mode must be one of {CODEC_MODES}, got {self.codec_mode!r}")
        if not 1 <= self.max_batch_size <= self.max_slots:
            raise ValueError("need 1 <= max_batch_size <= max_slots")
        if self.max_seq_len < 16:
            raise ValueError("max_seq_len must be >= 16 (a prompt is about 12 positions)")
        if self.max_seq_len < 32:
            raise ValueError("max_seq_len must be >= 32")


@dataclass
class _Slot:
    text: TextStream
    language_id: int | None
    speaker_id: int | None
    instruct_ids: list[int]
    forced_frames: int | None  # StreamParams.forced_frames
    greedy: tuple[bool, bool]  # (codebook 0, codebooks 1..15): host copy of the device rows
    whole_text: bool  # wait for the end of the text and put all of it in the prompt (see prompt.py)
    prefilled: bool = False
    frames: int = 0  # frames emitted
    position: int = 0  # talker positions written (KV length)
    done: bool = False
    history: list[np.ndarray] = field(default_factory=list)  # windowed codec mode: recent frames


class Qwen3TTSModel(Model):
    def __init__(
        self,
        cfg: Qwen3TTSConfig,
        mods: Modules,
        tokenizer: TextTokenizer,
        options: ServeOptions,
        random_weights: bool,
        speaker_encoder_weights: dict[str, Tensor] | None = None,
    ) -> None:
        self.cfg, self.options, self.tokenizer = cfg, options, tokenizer
        self.talker, self.code_predictor, self.codec = mods.talker, mods.code_predictor, mods.codec
        self.random_weights = random_weights
        self.speaker_encoder_weights = speaker_encoder_weights or {}  # Base: for the cloning path
        for m in (self.talker, self.code_predictor, self.codec):
            m.eval().requires_grad_(False)
        self.codec.prepare()
        p = next(self.talker.parameters())
        self.device, self.dtype = p.device, p.dtype
        t = cfg.talker
        voices = cfg.voices if cfg.model_type == "custom_voice" and cfg.voices else ("default",)
        self.info = ModelInfo(
            name="qwen3-tts",
            sample_rate_hz=cfg.codec.sample_rate_hz,
            frame_samples=cfg.codec.frame_samples,
            text_granularity=TextGranularity.WORD,
            max_batch_size=options.max_batch_size,
            max_slots=options.max_slots,
            voices=voices,
        )
        n, dev = options.max_slots, self.device
        self.kv = SlotKVCache(
            t.num_layers, n, t.num_kv_heads, options.max_seq_len, t.head_dim, self.dtype, dev
        )
        self.codec_states = CodecStatePool(
            n, self.codec.state_width, next(self.codec.parameters()).dtype, dev
        )
        self._last_codes = torch.zeros(n, t.num_code_groups, dtype=torch.int64, device=dev)
        self._seen = torch.zeros(n, t.vocab_size, dtype=torch.bool, device=dev)  # repetition penalty
        self._suppress = torch.zeros(t.vocab_size, dtype=torch.bool, device=dev)
        self._suppress[list(t.suppressed_ids)] = True
        # per-slot sampling rows: talker (codebook 0) and code predictor (1..15)
        self._greedy = torch.zeros(n, 2, dtype=torch.bool, device=dev)
        self._temp = torch.ones(n, 2, dtype=torch.float32, device=dev)
        self._top_k = torch.ones(n, 2, dtype=torch.int64, device=dev)
        self._top_p = torch.ones(n, 2, dtype=torch.float32, device=dev)
        self._penalty = torch.ones(n, dtype=torch.float32, device=dev)
        self._seed = torch.zeros(n, dtype=torch.int64, device=dev)
        # cp codebook-embedding tables stacked once: (15, vocab, H) for one gather per feed
        self._cp_tables = torch.stack(
            [cast(nn.Embedding, e).weight for e in self.code_predictor.codec_embedding]
        )
        self._slots: dict[int, _Slot] = {}

    # --- slot life ---------------------------------------------------------------------------------
    def open_slot(self, slot: int, params: StreamParams) -> None:
        if not 0 <= slot < self.options.max_slots:
            raise ModelError(slot, f"slot {slot} outside 0..{self.options.max_slots - 1}")
        t, g = self.cfg.talker, self.cfg.generation
        speaker_id: int | None = None
        voice = params.voice or self.info.voices[0]
        if self.cfg.model_type == "custom_voice":
            try:
                speaker_id = t.speaker_id(voice)
            except KeyError:
                raise ModelError(
                    slot, f"unknown voice {voice!r}; voices: {', '.join(self.info.voices)}"
                ) from None
        elif voice != "default":
            raise ModelError(
                slot, f"this {self.cfg.model_type} checkpoint has no named voices (voice cloning: later)"
            )
        language = params.language or "auto"
        try:
            language_id = t.language_id(language)
        except KeyError:
            names = ", ".join(["auto", *(name for name, _ in t.languages)])
            raise ModelError(slot, f"unknown language {language!r}; languages: {names}") from None
        dialect = t.speaker_dialect(voice) if speaker_id is not None else ""
        if dialect and language.lower() in ("chinese", "auto"):
            language_id = t.language_id(dialect)
        instruct = str(params.extra.get("instruct", "") or "")
        # the package drops instructions for the 0.6B model
        instruct_ids = (
            self.tokenizer.instruct_ids(instruct) if instruct and self.cfg.model_size != "0b6" else []
        )
        extra = params.extra
        greedy = params.greedy or not bool(extra.get("do_sample", g.do_sample))
        cp_greedy = params.greedy or not bool(extra.get("subtalker_do_sample", g.subtalker_do_sample))
        vocab = (t.vocab_size, self.cfg.code_predictor.vocab_size)
        rows = []  # (temperature, top_k, top_p) of codebook 0 and of codebooks 1..15
        for prefix, (temp, top_k, top_p) in (
            ("", (g.temperature, g.top_k, g.top_p)),
            ("subtalker_", (g.subtalker_temperature, g.subtalker_top_k, g.subtalker_top_p)),
        ):
            try:
                row = (
                    float(extra.get(prefix + "temperature", temp)),  # type: ignore[arg-type]
                    int(extra.get(prefix + "top_k", top_k)),  # type: ignore[call-overload]
                    float(extra.get(prefix + "top_p", top_p)),  # type: ignore[arg-type]
                )
            except (TypeError, ValueError):
                raise ModelError(slot, f"bad {prefix}temperature / top_k / top_p") from None
            if row[0] <= 0 or not 0 < row[2] <= 1:
                raise ModelError(slot, f"{prefix}temperature must be > 0 and {prefix}top_p in (0, 1]")
            rows.append(row)
        penalty = float(extra.get("repetition_penalty", g.repetition_penalty))  # type: ignore[arg-type]
        if penalty <= 0:
            raise ModelError(slot, "repetition_penalty must be > 0")
        # validated on the host; the device rows are written once per stream
        for col, (temp, top_k, top_p) in enumerate(rows):
            self._temp[slot, col] = temp
            self._top_k[slot, col] = top_k if top_k > 0 else vocab[col]  # 0 disables top-k (HF)
            self._top_p[slot, col] = top_p
        self._greedy[slot, 0], self._greedy[slot, 1] = greedy, cp_greedy
        self._penalty[slot] = penalty
        self._seed[slot] = (params.seed if params.seed is not None else random.getrandbits(32)) & 0xFFFFFFFF
        self._seen[slot] = False
        self.codec_states.reset(slot)
        self._slots[slot] = _Slot(
            text=TextStream(self.tokenizer),
            language_id=language_id,
            speaker_id=speaker_id,
            instruct_ids=instruct_ids,
            forced_frames=params.forced_frames,
            greedy=(greedy, cp_greedy),
            whole_text=bool(extra.get("whole_text", False)),
        )

    def add_text(self, slot: int, pieces: Sequence[str], final: bool) -> None:
        st = self._slot(slot)
        try:
            st.text.push(pieces, final)
        except ValueError as err:
            raise ModelError(slot, str(err)) from None

    def ready(self, slot: int) -> bool:
        st = self._slots.get(slot)
        if st is None or st.done:
            return False
        if not st.prefilled:
            return st.text.final if st.whole_text else bool(st.text.ids) or st.text.final
        # the feed after frame k-1 carries text token k
        return st.text.final or len(st.text.ids) > st.frames  # (whole text: final already)

    def close_slot(self, slot: int) -> None:
        # KV rows need no clearing (see kv_cache.py); decoder state and sampling rows are reset by
        # the next open_slot.
        self._slots.pop(slot, None)

    # --- generation --------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, slots: Sequence[int]) -> list[GenerateResult]:
        if len(slots) > self.options.max_batch_size:
            raise ValueError(f"{len(slots)} slots > max_batch_size {self.options.max_batch_size}")
        results: dict[int, GenerateResult] = {}
        new: list[int] = []
        running: list[int] = []
        for s in slots:
            st = self._slot(s)
            if not self.ready(s):
                results[s] = GenerateResult(s, None, 0, st.done)
            elif not st.prefilled and not st.text.ids:  # the text ended empty
                st.done = True
                results[s] = GenerateResult(s, None, 0, True)
            elif not st.prefilled and len(self._prompt(st)) >= self.options.max_seq_len:
                # refused before any work of this step, so the other slots are untouched
                raise ModelError(s, f"prompt longer than max_seq_len {self.options.max_seq_len}")
            else:
                (running if st.prefilled else new).append(s)
        batch = new + running
        if batch:
            hidden, logits = [], []
            if new:
                h, lg = self._prefill(new)
                hidden.append(h)
                logits.append(lg)
            if running:
                h, lg = self._feed(running)
                hidden.append(h)
                logits.append(lg)
            codes = self._sample_frame(batch, torch.cat(hidden), torch.cat(logits))
            host = codes.cpu().numpy()  # the one device->host copy of the step
            for i, s in enumerate(batch):
                results[s] = self._record(s, host[i])
        return [results[s] for s in slots]

    def _prefill(self, slots: list[int]) -> tuple[Tensor, Tensor]:
        cfg, dev = self.cfg, self.device
        prompts = [self._prompt(self._slots[s]) for s in slots]
        lengths = [len(p) for p in prompts]
        t = max(lengths)
        text = torch.full((len(slots), t), cfg.tts_pad_id, dtype=torch.int64)
        codec = torch.zeros(len(slots), t, dtype=torch.int64)
        has_codec = torch.zeros(len(slots), t, 1, dtype=torch.bool)
        for i, p in enumerate(prompts):
            text[i, : len(p)] = torch.tensor(p.text_ids)
            for j, c in enumerate(p.codec_ids):
                if c is not None:
                    codec[i, j], has_codec[i, j] = c, True
        text, codec, has_codec = text.to(dev), codec.to(dev), has_codec.to(dev)
        x = self.talker.embed_text(text) + self.talker.codec_embedding(codec) * has_codec  # (B, T, H)
        positions = torch.arange(t, device=dev).expand(len(slots), t)
        mask = torch.ones(t, t, dtype=torch.bool, device=dev).tril()[None, None]
        slot_idx = torch.tensor(slots, dtype=torch.int64, device=dev)
        hidden = self.talker(x, positions, self.kv.prefill(slot_idx, t), mask)  # (B, T, H)
        last = hidden[torch.arange(len(slots), device=dev), torch.tensor(lengths, device=dev) - 1]
        for s, n in zip(slots, lengths, strict=True):
            st = self._slots[s]
            st.prefilled, st.position = True, n
        return last, self.talker.logits(last)

    def _prompt(self, st: _Slot) -> Prompt:
        return build_prompt(
            self.cfg,
            self.tokenizer.role_ids,
            st.text.ids,
            st.language_id,
            st.speaker_id,
            st.instruct_ids,
            whole_text=st.whole_text,
        )

    def _feed(self, slots: list[int]) -> tuple[Tensor, Tensor]:
        cfg, dev = self.cfg, self.device
        host = []
        for s in slots:
            st = self._slots[s]
            # text token index carried by this feed; with the whole text in the prompt: pad from here on
            k = len(st.text.ids) + 1 if st.whole_text else st.frames
            tid = (
                st.text.ids[k]
                if k < len(st.text.ids)
                else cfg.tts_eos_id
                if k == len(st.text.ids)
                else cfg.tts_pad_id
            )
            host.append((s, st.position, tid))
        meta = torch.tensor(host, dtype=torch.int64).to(dev)  # (B, 3) one host->device copy
        slot_idx, positions, text_ids = meta[:, 0], meta[:, 1], meta[:, 2]
        prev = self._last_codes.index_select(0, slot_idx)  # (B, 16)
        groups = torch.arange(prev.shape[1] - 1, device=dev)[None, :]
        codec = torch.cat(
            (self.talker.codec_embedding(prev[:, :1]), self._cp_tables[groups, prev[:, 1:]]), dim=1
        ).sum(dim=1)  # (B, H): the sum of the frame's 16 code embeddings
        x = (codec + self.talker.embed_text(text_ids))[:, None]  # (B, 1, H)
        read_len = max(p for _, p, _ in host) + 1
        mask = (torch.arange(read_len, device=dev)[None, :] <= positions[:, None])[:, None, None]  # (B,1,1,S)
        kv = self.kv.decode(slot_idx, positions, read_len)
        hidden = self.talker(x, positions[:, None], kv, mask)[:, 0]
        for s in slots:
            self._slots[s].position += 1
        return hidden, self.talker.logits(hidden)

    def _sample_frame(self, slots: list[int], hidden: Tensor, logits: Tensor) -> Tensor:
        """hidden (B, H), logits (B, V) -> codes (B, 16) of the next frame, state rows updated."""
        dev, t = self.device, self.cfg.talker
        host = []
        for s in slots:
            st = self._slots[s]
            # random weights and forced lengths never stop on EOS; real ones not in the first frames
            no_eos = self.random_weights or self._forced(st) is not None
            no_eos = no_eos or st.frames < self.cfg.generation.min_new_tokens
            host.append((s, st.frames, int(no_eos)))
        meta = torch.tensor(host, dtype=torch.int64).to(dev)
        slot_idx, step, eos_masked = meta[:, 0], meta[:, 1], meta[:, 2].bool()
        scores = apply_repetition_penalty(
            logits, self._seen.index_select(0, slot_idx), self._penalty[slot_idx]
        )
        scores[:, t.codec_eos_id] = torch.where(eos_masked, float("-inf"), scores[:, t.codec_eos_id])
        scores = scores.masked_fill(self._suppress, float("-inf"))
        seed = self._seed[slot_idx]
        talker_params = RowParams(
            self._greedy[slot_idx, 0],
            self._temp[slot_idx, 0],
            self._top_k[slot_idx, 0],
            self._top_p[slot_idx, 0],
            seed,
            step,
        )
        drawn = [not self._slots[s].greedy[0] for s in slots], [not self._slots[s].greedy[1] for s in slots]
        code0 = sample(scores, talker_params, 0, any(drawn[0]))
        cp_params = RowParams(
            self._greedy[slot_idx, 1],
            self._temp[slot_idx, 1],
            self._top_k[slot_idx, 1],
            self._top_p[slot_idx, 1],
            seed,
            step,
        )
        rest = self.code_predictor.predict(
            hidden, self.talker.codec_embedding(code0), lambda j, lg: sample(lg, cp_params, j, any(drawn[1]))
        )
        codes = torch.cat((code0[:, None], rest), dim=1)
        self._last_codes.index_copy_(0, slot_idx, codes)
        self._seen.index_put_((slot_idx, code0), torch.ones_like(code0, dtype=torch.bool))
        return codes

    def _forced(self, st: _Slot) -> int | None:
        if st.forced_frames is not None:
            return st.forced_frames
        if self.random_weights and st.text.final:
            return max(1, round(self.options.random_frames_per_token * len(st.text.ids)))
        return None

    def _record(self, slot: int, codes: np.ndarray) -> GenerateResult:
        st = self._slots[slot]
        if int(codes[0]) == self.cfg.talker.codec_eos_id:
            st.done = True
            return GenerateResult(slot, None, 0, True)
        st.frames += 1
        forced = self._forced(st)
        st.done = (
            (forced is not None and st.frames >= forced)
            or st.frames >= self.cfg.generation.max_new_tokens
            or st.position + 1 > self.options.max_seq_len  # no room for the next feed
        )
        return GenerateResult(slot, codes[None].copy(), 1, st.done)

    # --- decode --------------------------------------------------------------------------------------
    @torch.no_grad()
    def decode(self, work: Sequence[DecodeWork]) -> list[np.ndarray]:
        out: list[np.ndarray | None] = [None] * len(work)
        if self.options.codec_mode == "windowed":
            return [self._decode_windowed(w) if w.n_frames else np.zeros(0, np.float32) for w in work]
        by_len: dict[int, list[int]] = {}
        for i, w in enumerate(work):
            if w.n_frames == 0:
                out[i] = np.zeros(0, np.float32)
            else:
                by_len.setdefault(w.n_frames, []).append(i)
        for items in by_len.values():
            codes = np.stack([self._frames(work[i]) for i in items])  # (G, n, 16)
            codes_t = torch.from_numpy(codes).to(self.device).transpose(1, 2)  # (G, 16, n)
            slot_idx = torch.tensor([work[i].slot for i in items], dtype=torch.int64, device=self.device)
            state, start = self.codec_states.gather(slot_idx)
            pcm, state, start = self.codec.stream(codes_t, state, start)
            self.codec_states.scatter(slot_idx, state, start)
            host = pcm.cpu().numpy()
            for row, i in enumerate(items):
                out[i] = host[row]
        return [o if o is not None else np.zeros(0, np.float32) for o in out]

    def _decode_windowed(self, w: DecodeWork) -> np.ndarray:
        st = self._slots.get(w.slot)
        frames = self._frames(w)
        ctx = self.options.windowed_left_context
        history = np.concatenate([*(st.history if st else []), frames])
        if st is not None:
            st.history = [history[-ctx:]]
        codes = torch.from_numpy(history).to(self.device).T[None]  # (1, 16, T)
        return self.codec.decode_windowed(codes, w.n_frames, ctx)[0].cpu().numpy()

    @staticmethod
    def _frames(w: DecodeWork) -> np.ndarray:
        frames = (
            np.concatenate([np.asarray(f) for f in w.frames]) if w.frames else np.zeros((0, 16), np.int64)
        )
        if frames.shape[0] != w.n_frames:
            raise ValueError(
                f"slot {w.slot}: {frames.shape[0]} frames in the payload, n_frames says {w.n_frames}"
            )
        return frames.astype(np.int64, copy=False)

    # --- misc ----------------------------------------------------------------------------------------
    def warmup(self) -> None:
        """One short utterance through generate and decode on slot 0 (before any stream is open)."""
        if self._slots:
            return
        self.open_slot(0, StreamParams(greedy=True, forced_frames=2, seed=0, voice=""))
        self.add_text(0, ["Hello."], True)
        frames = []
        while self.ready(0):
            r = self.generate([0])[0]
            if r.frames is not None:
                frames.append(r.frames)
            if r.finished:
                break
        if frames:
            self.decode([DecodeWork(0, frames, len(frames), True)])
        self.close_slot(0)

    def _slot(self, slot: int) -> _Slot:
        st = self._slots.get(slot)
        if st is None:
            raise ModelError(slot, f"slot {slot} is not open")
        return st
