"""Qwen3-TTS-12Hz behind the engine's ``Model`` contract: batched streaming generation and decode.

Life of a slot (host side: ``HostSlot``, host_slot.py; device side: rows of tensors indexed by slot):

    open_slot   the request checked (slot_request.py); sampling parameters -> device rows; codec state
                row reset; a Base checkpoint's cloned voice from ``extra["voice_profile"]``
                (voice_clone.py, clone_prefill.py)
    add_text    complete words -> token ids (tokenizer.TextStream)
    generate    NEW:     prefill the prompt but its last position: the talker alone, writing KV
                         (needs the first text token, or the end of the text; with
                         ``extra["whole_text"]`` all of the text, as the package's default
                         non-streaming mode); a prompt of one position, or whose head an earlier
                         stream had (prefix_cache.py: its KV copied in), needs no talker call. The
                         input of the last position waits on the device as the slot's first feed
                RUNNING: feed the last frame + the next text token (or tts-eos once, then tts-pad
                         after the end of the text); a stream whose next token has not arrived is
                         not ready: it waits rather than padding
                then one decode call over the running and the new slots together (a new slot's
                feed is its first feed): the talker's one-token step, sample codebook 0, run the
                code predictor for codebooks 1..15, one device->host copy of the (B, 16) codes;
                on that copy, the runaway guards (guards.py) end a stream that never says EOS or
                loops
    decode      frames -> PCM through the stateful streaming codec decoder: the due chunks of a
                tick in as few calls as pay off, each padded to a common frame count, each row
                advancing by its own count (codec_runner.py)
    close_slot  forget the host state, give the KV blocks back; device rows go to the next owner

Before each step the slots it writes get the KV blocks for their next positions (kv_cache.py
``grow``: one table copy per step); a slot the pool cannot grow ends with a "KV cache full" error.

One generate() call produces at most one frame per slot, a new slot's first frame included: its
prefill and its first feed run in the same call. The sampling tail runs once per call for all its
slots: its 15 code-predictor passes are a latency chain that costs about the same for 8 rows as
for 256. Per-step host work is O(batch) bookkeeping; the host never waits on the
device except for the one copy of the sampled codes (graph inputs go through pinned memory).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np
import torch
from torch import Tensor

from ..cloned_voice import ClonedVoice, CloningNotSupported
from ..model import (
    Decoded,
    DecodeWork,
    GenerateResult,
    KVRoom,
    Model,
    ModelError,
    ModelInfo,
    Queued,
    StreamParams,
    TextGranularity,
    with_frame_words,
)
from ..word_timing import TokenWords
from .clone_prefill import prefill_embedded, slot_voice
from .codec_runner import CodecRunner
from .codes_to_host import CodesToHost
from .config import Qwen3TTSConfig
from .cuda_graphs import CudaGraphs, bucket_for, frame_ladder, powers_of_two
from .frame_step import NO_CODEC, FrameStep, pack_prefill_row
from .guards import GuardLimits, RepetitionDetector
from .host_slot import FrameLimits, HostSlot, invalid_rows
from .host_staging import PinnedBlocks, Staging
from .kv_cache import PagedKVCache
from .layers import DecoderLayer
from .options import ServeOptions, default_decode_buckets
from .prefix_cache import PrefixCache
from .prompt import Prompt
from .slot_request import parse_request
from .slot_state import SlotState
from .tokenizer import MemoTokenizer, TextStream, TextTokenizer
from .voice_clone import VoiceCloner
from .weights import Modules

# (seconds of playback slack, frames): chunks of 24 and 48 frames for streams seconds ahead of their
# listener, where the codec has graphs of them (ModelInfo.slack_chunk_frames)
SLACK_CHUNK_FRAMES = ((2.0, 24), (6.0, 48))


class Qwen3TTSModel(Model):
    def __init__(
        self,
        cfg: Qwen3TTSConfig,
        mods: Modules,
        tokenizer: TextTokenizer,
        options: ServeOptions,
        random_weights: bool,
        speaker_encoder_weights: dict[str, Tensor] | None = None,
        cloner: VoiceCloner | None = None,
    ) -> None:
        self.cfg, self.options, self.tokenizer = cfg, options, tokenizer
        self.talker, self.code_predictor, self.codec = mods.talker, mods.code_predictor, mods.codec
        self.random_weights = random_weights
        self.speaker_encoder_weights = speaker_encoder_weights or {}  # Base: for the cloning path
        self.cloner = cloner  # Base: reference audio -> voice profiles (clone_voice)
        for m in (self.talker, self.code_predictor, self.codec):
            m.eval().requires_grad_(False)
        experimental = options.experimental
        self.codec.prepare(
            experimental.codec_kernels, experimental.codec_conv_kernel, experimental.codec_conv_kernel_min_frames
        )
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
            warm_load_streams=options.max_batch_size if self.device.type == "cuda" else 0,
            voices=voices,
            random_weights=random_weights,
            voice_encoder=cloner.encoder_id if cloner is not None else "",
            slack_chunk_frames=tuple(
                (slack_s, n)
                for slack_s, n in SLACK_CHUNK_FRAMES
                if options.cuda_graphs
                and self.device.type == "cuda"
                and n in frame_ladder(options.codec_graph_frames)
            ),
        )
        n, dev = options.max_slots, self.device
        # one extra row everywhere: the padding slot of the graph buckets (slot_state.py)
        self.pad_slot = n
        shape = (t.num_layers, options.pool_blocks, n, t.num_kv_heads, options.max_seq_len, t.head_dim)
        self.kv = PagedKVCache(*shape, self.dtype, dev, page=options.kv_page, prefixes=options.prefix_cache)
        self.state = SlotState(
            n,
            t.num_code_groups,
            t.vocab_size,
            options.max_seq_len,
            t.hidden_size,
            self.dtype,
            dev,
            self.kv.block_table.view(-1),
        )
        self._pinned = PinnedBlocks() if dev.type == "cuda" else None  # the steps' uploads (host_staging.py)
        for layer in (*self.talker.layers, *self.code_predictor.layers):
            cast(DecoderLayer, layer).fuse()  # q|k|v and gate|up: 3 fewer GEMM launches per layer
        fused_on = dev.type == "cuda" if experimental.fused_kernels is None else experimental.fused_kernels
        self.step = FrameStep(
            cfg,
            self.talker,
            self.code_predictor,
            self.kv,
            self.state,
            use_attention_kernel=experimental.attention_kernel and dev.type == "cuda",
            fused=experimental.fused if fused_on else None,
        )
        if experimental.compile_elementwise and dev.type == "cuda":
            from .fused_ops import compile_elementwise, compile_sampler

            compile_elementwise((self.talker, self.code_predictor))
            compile_sampler(self.step)
        self.decode_buckets = options.decode_buckets or default_decode_buckets(options.max_batch_size)
        self.prefill_batches = powers_of_two(min(options.max_prefill_batch, options.max_batch_size))
        self.prefill_lens = tuple(b for b in options.prefill_len_buckets if b <= options.max_seq_len)
        self.graphs = CudaGraphs(dev, options.cuda_graphs, options.experimental.warm_threads)
        self.prefixes = PrefixCache(
            options.prefix_cache, self.kv, self.step, self.graphs, self.prefill_batches, self.pad_slot
        )
        self.codec_runner = CodecRunner(
            self.codec, t.num_code_groups, options, self.graphs, self.pad_slot, dev
        )
        self.decode_overlaps = self.codec_runner.stream is not None
        self.urgent_decode = self.codec_runner.urgent_stream is not None
        # generate_start returns with the step queued on the device: the next may queue behind it
        self.steps_in_flight = 2 if dev.type == "cuda" else 1
        self._register_graphs()
        self._slots: dict[int, HostSlot] = {}
        self.limits = FrameLimits(
            cfg.talker.codec_eos_id,
            cfg.generation.max_new_tokens,
            options.max_seq_len,
            random_weights,
            options.random_frames_per_token,
        )
        self.repetition = RepetitionDetector(options.max_slots)
        self.invalid_code_rows = 0  # rows of sampled codes rejected by invalid_rows (expected: 0)
        self.codes_to_host = CodesToHost(options.max_batch_size, t.num_code_groups)
        self._text_tokenizer = MemoTokenizer(tokenizer)  # streamed text's splits and ids, remembered

    # --- slot life ---------------------------------------------------------------------------------
    def open_slot(self, slot: int, params: StreamParams) -> None:
        if not 0 <= slot < self.options.max_slots:
            raise ModelError(slot, f"slot {slot} outside 0..{self.options.max_slots - 1}")
        req = parse_request(
            self.cfg, self.tokenizer, self.info.voices, slot, params, self.random_weights, self.info.voice_encoder
        )
        guard = None
        if not self.random_weights and params.forced_frames is None:
            try:
                guard = GuardLimits.from_extra(params.extra)
            except ValueError as err:
                raise ModelError(slot, str(err)) from None
        self.state.open(slot, req.sampling, req.whole_text)
        self.repetition.open(slot, guard.repeat_frames if guard is not None else 0)
        self.kv.open(slot)
        self.codec_runner.open(slot)
        if req.profile is not None and req.profile.ref_codes is not None:
            self.codec_runner.prime(slot, req.profile.ref_codes.cpu().numpy().astype(np.int64))
        self._slots[slot] = HostSlot(
            text=TextStream(self._text_tokenizer),
            language_id=req.language_id,
            speaker_id=req.speaker_id,
            instruct_ids=req.instruct_ids,
            forced_frames=params.forced_frames,
            greedy=req.sampling.greedy,
            whole_text=req.whole_text,
            guard=guard,
            words=None if req.whole_text else TokenWords(self._text_tokenizer.split, self._text_tokenizer.encode),
            voice=None
            if (profile := req.profile) is None
            else slot_voice(
                profile, self.step, self.tokenizer.encode(profile.ref_text) if profile.ref_text else ()
            ),
        )

    def add_text(self, slot: int, pieces: Sequence[str], final: bool) -> None:
        st = self._slot(slot)
        before = len(st.fed_ids())
        n_ids, pending = len(st.text.ids), st.text.pending_text
        try:
            st.text.push(pieces, final)
        except ValueError as err:
            raise ModelError(slot, str(err)) from None
        if st.words is not None:  # the text just tokenized: what was pending and given, less what still is
            given = pending + "".join(pieces)
            st.words.add(given[: len(given) - len(st.text.pending_text)], len(st.text.ids) - n_ids)
        # the device queue holds max_seq_len tokens: a stream needs one position per streamed token, so
        # it stops before reading past them (a too-long whole-text prompt is refused by generate)
        room = self.state.max_text_tokens
        self.state.append_text(slot, min(before, room), st.fed_ids()[before:room])

    def ready(self, slot: int) -> bool:
        st = self._slots.get(slot)
        return st is not None and st.ready(self.limits)

    def close_slot(self, slot: int) -> None:
        # KV blocks need no clearing (see kv_cache.py); decoder state and sampling rows are reset by
        # the next open_slot.
        self._slots.pop(slot, None)
        self.kv.pool.release(slot)
        self.codec_runner.close(slot)

    def kv_room(self) -> KVRoom:
        return self.kv.room()

    # --- generation --------------------------------------------------------------------------------
    def generate(self, slots: Sequence[int]) -> list[GenerateResult]:
        return self.generate_start(slots)()

    @torch.no_grad()
    def generate_start(self, slots: Sequence[int]) -> Queued[list[GenerateResult]]:
        """The step's prefill and decode graphs and the copy of its codes, queued (behind any step
        begun before, whose frames ``ready`` counts already); the returned function waits for the
        codes and records each slot's frame; its ``done`` asks whether they are there."""
        if len(slots) > self.options.max_batch_size:
            raise ValueError(f"{len(slots)} slots > max_batch_size {self.options.max_batch_size}")
        results: dict[int, GenerateResult] = {}
        prompts: dict[int, Prompt] = {}  # the new slots', built once for the length check and the prefill
        running: list[int] = []
        grow: dict[int, int] = {}  # positions each slot will have written: the running ones first
        hosts, limits = self._slots, self.limits
        for s in slots:
            st = self._slot(s)
            if not st.ready(limits):
                results[s] = GenerateResult(s, None, 0, st.done)
            elif st.prefilled:
                running.append(s)
                grow[s] = st.position + 1
            elif not st.text.ids:  # the text ended empty
                st.done = True
                results[s] = GenerateResult(s, None, 0, True)
            elif len(prompt := self._prompt(st)) >= self.options.max_seq_len:
                # refused before any work of this step, so the other slots are untouched
                raise ModelError(s, f"prompt longer than max_seq_len {self.options.max_seq_len}")
            else:
                prompts[s] = prompt
        grow.update((s, len(p)) for s, p in prompts.items())
        full = self.kv.grow(grow)
        for s, error in full.items():  # no block for its next position: this one ends
            hosts[s].done = True
            results[s] = GenerateResult(s, None, 0, True, error=error)
        if full:
            running = [s for s in running if s not in results]
        new = [s for s in prompts if s not in results]
        # the step's uploads, released once its codes are waited for (then every copy of them is done)
        staging = Staging(self._pinned, self.device)
        # the rows, text and KV blocks the step reads (open_slot, add_text and grow queue them)
        self.state.flush(staging, self.kv.pool.take_writes())
        attached = self.prefixes.split(new, prompts, hosts)  # their prompt's head is kept: no prefill
        fresh = [s for s in new if s not in attached]
        per_call = self.prefill_batches[-1]
        for group in (fresh[i : i + per_call] for i in range(0, len(fresh), per_call)):
            self._run_prefill(group, [prompts[s] for s in group], staging)
        self.prefixes.attach(attached, prompts, staging)  # before learn may give their entries away
        self.prefixes.learn(fresh, prompts, hosts)
        for s in new:
            hosts[s].prefilled, hosts[s].position = True, len(prompts[s]) - 1
        batch = running + new  # new slots make their first frame in the same decode call
        size = self.decode_buckets[-1]
        parts: list[Tensor] = []
        for i in range(0, len(batch), size):
            if parts:  # the next call may replay the same graph, overwriting the static output
                parts[-1] = parts[-1].clone()
            parts.append(self._run_decode(batch[i : i + size], staging))
        if not batch:  # staging dropped unreleased: its copies may still be queued (host_staging.py)
            return Queued.finished([results[s] for s in slots])
        codes = self.codes_to_host.start(parts[0] if len(parts) == 1 else torch.cat(parts))
        self.codec_runner.reset_opened(early=True)  # on the codec's lane while the step runs, not in a first chunk's begin

        def finish() -> list[GenerateResult]:
            host = codes()  # (B, 16), the caller's own: each row becomes its slot's frame
            staging.release()
            bad = invalid_rows(host, self.cfg.codec.codebook_size, self.cfg.talker.codec_eos_id)
            self.invalid_code_rows += int(np.count_nonzero(bad))
            code0 = host[:, 0]
            looped = self.repetition.push(np.asarray(batch), code0)
            # each row as a (1, 16) view of the copy: its slot's frame, kept by the result
            rows = zip(batch, host[:, None], code0.tolist(), looped.tolist(), bad.tolist(), strict=True)
            for s, frame, c0, loops, invalid in rows:
                results[s] = hosts[s].record(s, frame, c0, loops, limits, invalid)
            return [results[s] for s in slots]

        return Queued(finish, codes.done)

    def _run_decode(self, group: list[int], staging: Staging) -> Tensor:
        b = bucket_for(len(group), self.decode_buckets)
        rows = np.full(b, self.pad_slot, np.int64)
        rows[: len(group)] = group
        codes = self.graphs.run(("decode", b), rows, staging)
        hosts = self._slots
        for s in group:
            st = hosts[s]
            st.position += 1
            st.begun += 1
        # a view of the static output: the copy to the host is queued before the next step's replay
        return codes[: len(group)]

    def _run_prefill(self, group: list[int], prompts: list[Prompt], staging: Staging) -> None:
        """The group's prompts but their last positions into the KV cache; those wait as first feeds
        for this step's decode call (frame_step.py)."""
        voices = [self._slots[s].voice for s in group]
        if any(v is not None for v in voices):  # vectors in the prompt: not a packed-id row
            prefill_embedded(self.step, prompts, voices, group)
        else:
            longest = max(len(p) for p in prompts) - 1  # talker positions: all but the last
            b = bucket_for(len(group), self.prefill_batches)
            # no bucket that long: eager at the exact length; none at all for prompts of one position
            t = next((n for n in self.prefill_lens if n >= longest), longest) if longest else 0
            rows = np.array(
                [
                    pack_prefill_row(list(p.text_ids), list(p.codec_ids), s, t)
                    for p, s in zip(prompts, group, strict=True)
                ]
                + [pack_prefill_row([0], [NO_CODEC], self.pad_slot, t)] * (b - len(group)),
                dtype=np.int64,
            )
            if self.graphs.has(("prefill", b, t)):
                self.graphs.run(("prefill", b, t), rows, staging)
            else:  # prompts longer than every length bucket (whole text), or of one position: eager
                self.step.prefill(staging.put(rows[: len(group)], torch.int64))

    def _register_graphs(self) -> None:
        """Every bucket's body with padding-slot example rows (captured in ``warmup``)."""
        pad = self.pad_slot
        for b in self.decode_buckets:
            self.graphs.add(("decode", b), self.step.decode, torch.full((b,), pad, dtype=torch.int64))
        for b in self.prefill_batches:
            for t in self.prefill_lens:
                row = pack_prefill_row([0], [NO_CODEC], pad, t)
                self.graphs.add(("prefill", b, t), self.step.prefill, torch.tensor([row] * b))
        self.prefixes.register_graphs()
        self.codec_runner.register_graphs()

    def _prompt(self, st: HostSlot) -> Prompt:
        return st.prompt(self.cfg, self.tokenizer.role_ids)

    # --- decode --------------------------------------------------------------------------------------
    def decode(self, work: Sequence[DecodeWork]) -> list[np.ndarray]:
        """All due chunks of all streams, through the slots' streaming codec (codec_runner.py)."""
        return self.codec_runner.decode(work)

    def decode_start(self, work: Sequence[DecodeWork], urgent: bool = False) -> Queued[list[Decoded]]:
        """``decode_timed`` queued on the codec's own CUDA stream (``urgent``: on its urgent lane,
        codec_runner.py); the engine runs frame steps meanwhile."""
        pcm = self.codec_runner.decode_start(work, urgent)
        return Queued(lambda: with_frame_words(work, pcm(), self.info.frame_samples), pcm.done)

    def device_wait_s(self) -> float:
        """The waits for each step's codes and each tick's PCM (Model.device_wait_s)."""
        return self.codes_to_host.wait_s + self.codec_runner.wait_s

    # --- cloning -------------------------------------------------------------------------------------
    def clone_voice(self, pcm: np.ndarray, sample_rate_hz: int, ref_text: str) -> ClonedVoice:
        """Runs beside the worker (Model.clone_voice): the cloner's encoders are its own modules,
        no slot state is read or written."""
        if self.cloner is None:
            raise CloningNotSupported(
                f"this {self.cfg.model_type} checkpoint cannot clone voices (Base only)"
            )
        return self.cloner.profile(pcm, sample_rate_hz, ref_text).to_cloned(self.cloner.encoder_id)

    # --- misc ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def warmup(self) -> None:
        """Capture the CUDA graphs, then one short utterance through generate and decode on slot 0
        (before any stream is open)."""
        if self._slots:
            return
        # the codec graphs keep the conv algorithms cuDNN times for the calls it still runs (1.5-1.9x
        # faster than its heuristics' when it ran all: docs/performance-history.md); the flag is
        # restored after, so a rare eager call of another length pays no timing run
        cudnn = torch.backends.cudnn
        before = cudnn.benchmark, cudnn.benchmark_limit
        cudnn.benchmark = before[0] or self.options.codec_cudnn_benchmark
        cudnn.benchmark_limit = self.options.codec_cudnn_limit
        try:
            self.graphs.capture()
        finally:
            cudnn.benchmark, cudnn.benchmark_limit = before
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
            self.decode([DecodeWork(slot=0, frames=frames, n_frames=len(frames), final=True)])
        self.close_slot(0)

    def _slot(self, slot: int) -> HostSlot:
        st = self._slots.get(slot)
        if st is None:
            raise ModelError(slot, f"slot {slot} is not open")
        return st
