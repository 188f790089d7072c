"""Every per-stream value the frame step reads or writes, as device tensors indexed by slot.

Rows ``0 .. max_slots - 1`` belong to streams; row ``max_slots`` is the padding slot: the rows of a
batch bucket that no stream uses point at it, so a captured graph always runs its full bucket and
the padding writes land where nobody reads (its position and frame count are re-zeroed after each
step, so its KV writes stay in range).

Before each step the host writes the rows of the streams opened since the last (sampling
parameters, flags) and the text that arrived meanwhile (token ids), every slot's at once; the frame step
(frame_step.py) reads and advances the rest on the device: no per-stream value crosses to the host
during a step except the sampled codes. The prefill leaves one row for the decode
step: the input of the prompt's last position (``first_feed``), which that step feeds instead of a
last frame.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from voicewire.kernels.reference import SlotRows, slot_writes_reference

from .host_staging import Staging


@dataclass(frozen=True)
class SamplingRow:
    """Host-validated sampling parameters of one stream: index 0 = codebook 0, 1 = codebooks 1..15."""

    greedy: tuple[bool, bool]
    temperature: tuple[float, float]
    top_k: tuple[int, int]  # already mapped: >= vocab disables
    top_p: tuple[float, float]
    repetition_penalty: float
    seed: int  # 0 <= seed < 2**32
    eos_always_masked: bool  # random weights or a forced length: never stop on EOS


class SlotState:
    def __init__(
        self,
        max_slots: int,
        num_code_groups: int,
        talker_vocab: int,
        max_text_tokens: int,
        hidden_size: int,
        dtype: torch.dtype,
        device: torch.device,
        table: torch.Tensor,
    ) -> None:
        """``table``: the KV cache's block table, flat (its changes go up with each flush)."""
        n, dev = max_slots + 1, device
        self.pad_slot = max_slots
        self.max_text_tokens = max_text_tokens
        self.last_codes = torch.zeros(
            n, num_code_groups, dtype=torch.int64, device=dev
        )  # (N+1, 16) the frame fed next
        self.position = torch.zeros(n, dtype=torch.int64, device=dev)  # talker positions written = KV length
        self.frames = torch.zeros(
            n, dtype=torch.int64, device=dev
        )  # frames sampled so far (the sampling-noise step)
        self.seen = torch.zeros(n, talker_vocab, dtype=torch.bool, device=dev)  # repetition history
        # the prompt's last position, embedded (H,) in the talker's dtype: the first frame's feed, set
        # by the prefill and taken (pending cleared) by the decode step that makes frame 0
        self.first_feed = torch.zeros(n, hidden_size, dtype=dtype, device=dev)
        self.first_feed_pending = torch.zeros(n, dtype=torch.bool, device=dev)
        # text queue: token ids received so far, how many, and whether they all went into the prompt
        self.text = torch.zeros(n, max_text_tokens, dtype=torch.int64, device=dev)
        self.text_len = torch.zeros(n, dtype=torch.int64, device=dev)
        self.whole_text = torch.zeros(n, dtype=torch.bool, device=dev)
        # sampling rows; column 0 = talker (codebook 0), column 1 = code predictor (codebooks 1..15)
        self.greedy = torch.zeros(n, 2, dtype=torch.bool, device=dev)
        self.temperature = torch.ones(n, 2, dtype=torch.float32, device=dev)
        self.top_k = torch.ones(n, 2, dtype=torch.int64, device=dev)
        self.top_p = torch.ones(n, 2, dtype=torch.float32, device=dev)
        self.penalty = torch.ones(n, dtype=torch.float32, device=dev)
        self.seed = torch.zeros(n, dtype=torch.int64, device=dev)
        self.eos_masked = torch.zeros(n, dtype=torch.bool, device=dev)
        self.rows = SlotRows(
            self.top_k,
            self.seed,
            self.greedy,
            self.eos_masked,
            self.whole_text,
            self.temperature,
            self.top_p,
            self.penalty,
            self.seen,
            self.first_feed_pending,
            self.position,
            self.frames,
            self.text_len,
            self.text,
            table,
        )
        self._apply = slot_writes_reference
        if dev.type == "cuda":
            from voicewire.kernels.slot_writes import check_slot_rows, slot_writes

            check_slot_rows(self.rows)
            self._apply = slot_writes
        # what the host wrote since the last step, uploaded together before the next one (flush):
        # the rows of the slots opened, and per slot its new text (its first new position and the
        # ids from there)
        self._opens: dict[int, tuple[SamplingRow, bool]] = {}
        self._text_writes: dict[int, tuple[int, list[int]]] = {}

    def open(self, slot: int, row: SamplingRow, whole_text: bool) -> None:
        """Reset a slot's row for a new stream, with the next ``flush``: every slot opened since the
        last step in one copy and one launch, not a dozen small writes of each (hundreds of opens
        a second at load)."""
        self._opens[slot] = (row, whole_text)
        self._text_writes.pop(slot, None)  # a closed stream's text, never stepped

    def append_text(self, slot: int, start: int, ids: Sequence[int]) -> None:
        """Token ids ``start .. start + len(ids)`` of a slot's text arrived (the host checked the room);
        they reach the device with the next ``flush``."""
        if not ids:
            return
        first, queued = self._text_writes.setdefault(slot, (start, []))
        if start != first + len(queued):
            raise ValueError(f"slot {slot}: text from position {start}, expected {first + len(queued)}")
        queued.extend(ids)

    def flush(self, staging: Staging, table: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """The opens and the text since the last flush, and the KV cache's block table changes
        (``table``: flat indices and blocks, ``KVPool.take_writes``), onto the device before a step
        (whose feeds read them): one copy queued through pinned memory, never waited for (``t[slot]
        = value`` on a CUDA tensor is a pageable copy of one element, which waits for everything
        queued on the stream: the frame steps in flight), and on CUDA one launch applying it all
        (kernels/slot_writes.py: a scatter or fill per row tensor would be ~25 launches)."""
        if not self._opens and not self._text_writes and table is None:
            return
        opens, texts = self._opens, self._text_writes
        self._opens, self._text_writes = {}, {}
        width = self.max_text_tokens
        ends = {s: first + len(ids) for s, (first, ids) in texts.items()}
        parts = []  # the layout's sections (kernels/slot_writes.py); most steps have text alone
        if opens:
            ints = np.array(
                [
                    (s, *r.top_k, r.seed, *r.greedy, r.eos_always_masked, whole, ends.get(s, 0))
                    for s, (r, whole) in opens.items()
                ],
                np.int64,
            )
            floats = np.array(
                [(*r.temperature, *r.top_p, r.repetition_penalty) for r, _ in opens.values()], np.float32
            )
            parts.append(np.concatenate([ints, floats.view(np.int32).astype(np.int64)], axis=1).reshape(-1))
        text_at = [s * width + first + i for s, (first, ids) in texts.items() for i in range(len(ids))]
        lens = [s for s in texts if s not in opens]
        text_ids = [v for _, ids in texts.values() for v in ids]
        parts.append(np.array(text_at + text_ids + lens + [ends[s] for s in lens], np.int64))
        at, blocks = table if table is not None else (np.empty(0, np.int64),) * 2
        if len(at):
            parts += (at.astype(np.int64), blocks.astype(np.int64))
        packed = parts[0] if len(parts) == 1 else np.concatenate(parts)
        counts = (len(opens), len(text_at), len(lens), len(at))
        self._apply(staging.put(packed, torch.int64), *counts, self.rows)

    def rezero_padding(self) -> None:
        """Keep the padding slot's counters at 0 (called inside the step: graph-capturable)."""
        self.position[self.pad_slot].zero_()
        self.frames[self.pad_slot].zero_()
