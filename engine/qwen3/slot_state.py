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

import torch


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
    ) -> None:
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
        # what the host wrote since the last step, uploaded together before the next one (flush):
        # the rows of the slots opened, and per slot its new text (its first new position and the
        # ids from there)
        self._opens: dict[int, tuple[SamplingRow, bool]] = {}
        self._text_writes: dict[int, tuple[int, list[int]]] = {}

    def open(self, slot: int, row: SamplingRow, whole_text: bool) -> None:
        """Reset a slot's row for a new stream, with the next ``flush``: every slot opened since the
        last step in a few copies and scatters, not a dozen small writes of each (hundreds of opens
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

    def flush(self) -> None:
        """The opens and the text since the last flush onto the device (before a step, whose feeds
        read them): queued through pinned memory, never waited for (``t[slot] = value`` on a CUDA
        tensor is a pageable copy of one element, which waits for everything queued on the
        stream: the frame steps in flight)."""
        self._flush_opens()
        self._flush_text()

    def _flush_opens(self) -> None:
        """Each opened slot's sampling row and flags, its counters zeroed: one copy of the integers,
        one of the floats, then a scatter (or fill) per row tensor, however many slots opened."""
        if not self._opens:
            return
        slots, rows = list(self._opens), list(self._opens.values())
        self._opens = {}
        dev = self.text.device
        ints = to_device(  # (8, m): slot | top_k x2 | seed | greedy x2, eos_masked, whole_text as 0/1
            [
                slots,
                *zip(*(r.top_k for r, _ in rows), strict=True),
                [r.seed for r, _ in rows],
                *zip(*(r.greedy for r, _ in rows), strict=True),
                [r.eos_always_masked for r, _ in rows],
                [whole for _, whole in rows],
            ],
            torch.int64,
            dev,
        )
        floats = to_device(  # (5, m): temperature x2 | top_p x2 | repetition penalty
            [
                *zip(*(r.temperature for r, _ in rows), strict=True),
                *zip(*(r.top_p for r, _ in rows), strict=True),
                [r.repetition_penalty for r, _ in rows],
            ],
            torch.float32,
            dev,
        )
        at, flags = ints[0], ints[4:].bool()
        self.top_k.index_copy_(0, at, ints[1:3].T)
        self.seed.index_copy_(0, at, ints[3])
        self.greedy.index_copy_(0, at, flags[0:2].T)
        self.eos_masked.index_copy_(0, at, flags[2])
        self.whole_text.index_copy_(0, at, flags[3])
        self.temperature.index_copy_(0, at, floats[0:2].T)
        self.top_p.index_copy_(0, at, floats[2:4].T)
        self.penalty.index_copy_(0, at, floats[4])
        for t in (self.seen, self.first_feed_pending, self.position, self.frames, self.text_len):
            t.index_fill_(0, at, 0)

    def _flush_text(self) -> None:
        """The text appended since the last flush, all slots in one copy and two scatters: text
        streamed a word at a time comes as a push per word, thousands a second at load, and a write
        of its own for each (a pinned block, a copy and a fill) is worker time per word rather than
        per step."""
        if not self._text_writes:
            return
        width = self.max_text_tokens
        at = [s * width + first + i for s, (first, ids) in self._text_writes.items() for i in range(len(ids))]
        values = [v for _, ids in self._text_writes.values() for v in ids]
        slots = list(self._text_writes)
        ends = [first + len(ids) for first, ids in self._text_writes.values()]
        self._text_writes = {}
        n, m = len(at), len(slots)
        packed = to_device(at + values + slots + ends, torch.int64, self.text.device)
        self.text.view(-1).index_copy_(0, packed[:n], packed[n : 2 * n])
        self.text_len.index_copy_(0, packed[2 * n : 2 * n + m], packed[2 * n + m :])

    def rezero_padding(self) -> None:
        """Keep the padding slot's counters at 0 (called inside the step: graph-capturable)."""
        self.position[self.pad_slot].zero_()
        self.frames[self.pad_slot].zero_()


def to_device(values: Sequence[object], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list as a tensor on ``device``, queued through pinned memory without blocking the
    host (``torch.tensor(values, device=cuda)`` copies from pageable memory: it waits for the
    stream's queued work, as ``SlotState.flush`` says)."""
    src = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return src
    return src.pin_memory().to(device, non_blocking=True)
