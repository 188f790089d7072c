"""New streams' first frames on a lane of their own (Model.first_start), beside the frame steps in flight.

A new turn's first frame otherwise waits for the steps already queued on the device (two of them
under load, ~15 ms each at 512 rows) before its own prefill and decode step run. Here one call per
tick takes a few new slots of packed-id prompts: their prompts prefilled whole and each last
position's hidden state sampled (FrameStep.prefill_first), a graph per (rows, prompt length) in a
pool of its own, replayed on a CUDA stream of the highest priority. It writes only its slots' rows
(and the padding slot's, whose values nothing reads): their state and text, their KV blocks and
table rows, queued on the lane. A slot on the lane is not ready (HostSlot.first_pending) until its
codes are taken, so no frame step reads its rows before the lane's writes are done. Off CUDA the
call runs at once, as every other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ..model import GenerateResult, Queued
from .cuda_graphs import bucket_for
from .frame_step import NO_CODEC, pack_prefill_row, pack_prefill_rows

if TYPE_CHECKING:
    from .model import Qwen3TTSModel

# the lane's stream: the highest priority (torch clamps it), as the codec's urgent lane, so a new
# turn's first frame takes the SMs a loaded frame step leaves between its launches
PRIORITY = -100
CUDA_ROWS = 8  # new slots a call on CUDA by default: a tick's new turns at 400 a second


def lane_rows(rows: int | None, device: torch.device) -> int:
    """ServeOptions.first_lane_rows resolved: None is CUDA_ROWS on CUDA, 0 (no lane) elsewhere: a
    CPU would compute a second sampling tail a tick where a GPU overlaps it."""
    return rows if rows is not None else CUDA_ROWS * (device.type == "cuda")


class FirstLane:
    def __init__(self, model: Qwen3TTSModel) -> None:
        self.model = model
        dev = model.device
        self.stream = torch.cuda.Stream(dev, priority=PRIORITY) if dev.type == "cuda" else None

    def register_graphs(self) -> None:
        m = self.model
        for b in m.prefill_batches:
            for t in m.prefill_lens:
                if b <= m.first_lane_rows:
                    example = torch.tensor([pack_prefill_row([0], [NO_CODEC], m.pad_slot, t)] * b)
                    m.graphs.add(("first", b, t), m.step.prefill_first, example, pool="first", priority=PRIORITY)

    @torch.no_grad()
    def start(self, slots: Sequence[int]) -> Queued[list[GenerateResult]] | None:
        """Model.first_start; None for slots it cannot take: a cloned voice, a prompt past the length
        buckets, no KV block, more slots than ``first_lane_rows``."""
        m = self.model
        if not slots or len(slots) > m.first_lane_rows:
            return None
        hosts = [m._slots[s] for s in slots]
        if any(st.prefilled or st.voice is not None or not st.ready(m.limits) for st in hosts):
            return None
        prompts = [m._prompt(st) for st in hosts]
        longest = max(len(p) for p in prompts)
        t = next((n for n in m.prefill_lens if n >= longest), 0)
        key = ("first", bucket_for(len(slots), m.prefill_batches), t)
        if longest >= m.options.max_seq_len or not m.graphs.has(key):  # (the step refuses the first)
            return None
        ensure = m.kv.pool.ensure  # blocks taken for a slot refused here stay its own for its step
        if not all([ensure(s, len(p)) for s, p in zip(slots, prompts, strict=True)]):
            return None
        staged: list[torch.Tensor] = []
        with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
            m.state.flush(slots)  # these slots' rows and text; the rest goes with the next step
            m.kv.flush()  # the table's changes: these slots' blocks, and closed slots' (no step reads them)
            rows = pack_prefill_rows(prompts, slots, key[1], t, m.pad_slot)
            codes = m.codes_to_host.start(m.graphs.run(key, rows, staged)[: len(slots)])
        for st, p in zip(hosts, prompts, strict=True):
            st.prefilled, st.position, st.first_pending = True, len(p), True
            st.begun += 1

        def finish() -> list[GenerateResult]:
            host = codes()
            staged.clear()
            for st in hosts:
                st.first_pending = False
            return m.record_codes(slots, host)

        return Queued(finish, codes.done)
