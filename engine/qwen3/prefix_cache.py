"""Prompt prefixes kept on the device: a new stream's prefill without the talker.

A streamed-text prompt is a head that depends only on the voice, the language and the instruction
(prompt.py: the role, the think / language / speaker codec positions, tts_bos) and a last position
that carries the first text token. The prefill runs the talker over all positions but the last, so
for such a prompt it writes the head's KV and nothing else: the same KV for every stream of that
voice. The first stream of a head is prefilled as usual and its head's KV kept (kv_cache.py
``save_prefix``); every later one has that KV copied into its first block and its last position
stored as its first feed (``FrameStep.attach``, a graph per prefill batch bucket): a copy of ~2 MB a
stream instead of the talker's 28 layers over 16 positions, in the step that makes its first frame.

Kept: heads of at most ``PREFIX_POSITIONS`` positions (kv_cache.py), of prompts with no whole text
(whose prompt holds the text) and no in-context voice (whose prompt ends in the reference frames). A
voice cloned from an x-vector is in its head, at the speaker position: the head is kept under the
vector's digest (clone_prefill.py ``SlotVoice.key``), so an agent's turns in one cloned voice start
without a prefill too. The least recently used head makes way when all entries are taken. An entry
dropped while a step that reads it is queued is safe: the device runs the work of later steps after it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import torch

from .cuda_graphs import CudaGraphs, bucket_for
from .frame_step import FrameStep
from .host_slot import HostSlot
from .host_staging import Staging
from .kv_cache import PagedKVCache
from .prompt import Prompt

Head = tuple[tuple[int, ...], tuple[int | None, ...], bytes]  # ids, then the cloned voice's key


class PrefixCache:
    def __init__(
        self, entries: int, kv: PagedKVCache, step: FrameStep, graphs: CudaGraphs, batches: Sequence[int], pad_slot: int
    ) -> None:
        self.kv, self.step, self.graphs, self.batches, self.pad_slot = kv, step, graphs, tuple(batches), pad_slot
        self._entries: OrderedDict[Head, int] = OrderedDict()  # head -> entry, least recently used first
        self._free = list(range(entries, 0, -1))  # entry 0 is the padding rows' scratch
        self.hits = 0  # streams attached to a kept head (the tests count them)

    def register_graphs(self) -> None:
        for b in self.batches:
            self.graphs.add(("attach", b), self.step.attach, torch.tensor([self._padding()] * b))

    def split(self, new: list[int], prompts: dict[int, Prompt], hosts: dict[int, HostSlot]) -> dict[int, int]:
        """The new slots whose head is kept, each with its entry: attached (``attach``) rather than
        prefilled. Their heads become the most recently used."""
        found: dict[int, int] = {}
        for s in new:
            head = self._head(prompts[s], hosts[s])
            if head is not None and head in self._entries:
                self._entries.move_to_end(head)
                found[s] = self._entries[head]
        return found

    def attach(self, entries: dict[int, int], prompts: dict[int, Prompt], staging: Staging) -> None:
        """Each slot's kept head (``split``'s entries) into its first block, its last position its
        first feed."""
        group = list(entries)
        for i in range(0, len(group), self.batches[-1]):
            part = group[i : i + self.batches[-1]]
            b = bucket_for(len(part), self.batches)
            rows = [[prompts[s].text_ids[-1], prompts[s].codec_ids[-1], len(prompts[s]) - 1, s, entries[s]] for s in part]
            packed = np.array(rows + [self._padding()] * (b - len(part)), dtype=np.int64)
            self.graphs.run(("attach", b), packed, staging)
            self.hits += len(part)

    def learn(self, group: list[int], prompts: dict[int, Prompt], hosts: dict[int, HostSlot]) -> None:
        """The heads of slots just prefilled (queued before this) that are not kept yet, kept."""
        for s in group:
            head = self._head(prompts[s], hosts[s])
            if head is None or head in self._entries:
                continue
            if not self._free:
                if not self._entries:
                    return  # no entries at all
                self._free.append(self._entries.popitem(last=False)[1])
            entry = self._entries[head] = self._free.pop()
            self.kv.save_prefix(entry, s)

    def _head(self, prompt: Prompt, host: HostSlot) -> Head | None:
        voice = host.voice
        if host.whole_text or (voice is not None and voice.ref_frames is not None):
            return None
        if not 1 < len(prompt) <= self.kv.prefix_len + 1:
            return None
        return prompt.text_ids[:-1], prompt.codec_ids[:-1], b"" if voice is None else voice.key

    def _padding(self) -> list[int]:
        return [0, 0, 0, self.pad_slot, 0]
