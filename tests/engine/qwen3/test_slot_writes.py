"""A new stream's device writes are queued, never waited for.

``t[i] = value`` on a CUDA tensor copies one element from pageable memory, which waits for all the
work queued on the stream: the frame steps in flight. The worker opens streams between steps, so
every open would hold it until the device ran dry (on the H200 at 240 req/s the commands took 4.45
ms of an 11-ms tick). A slot's open, its text and its KV blocks therefore wait on the host for the next step,
which uploads every slot's at once through pinned memory, and its codec state reset goes through
pinned memory too. Checked on the CPU, where the same code runs, by the pattern; on CUDA
(``VOICEWIRE_TEST_DEVICE=cuda``) also by torch's sync debug mode.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from voicewire.engine.model import StreamParams
from voicewire.engine.qwen3.host_staging import Staging
from voicewire.engine.qwen3.model import Qwen3TTSModel
from voicewire.engine.qwen3.slot_request import parse_request

from .conftest import flush


@contextmanager
def _element_writes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The ``t[i] = python_value`` writes of one element made inside the block."""
    seen: list[str] = []
    setitem = torch.Tensor.__setitem__

    def record(self: torch.Tensor, key: Any, value: Any) -> None:
        if not isinstance(value, torch.Tensor) and self[key].dim() == 0:
            seen.append(f"{tuple(self.shape)}[{key!r}] = {value!r}")
        setitem(self, key, value)

    with monkeypatch.context() as m:
        m.setattr(torch.Tensor, "__setitem__", record)
        yield seen


def _count_uploads(m: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the values each ``Staging.put`` uploads from now on (in ``m``'s context)."""
    uploads: list[int] = []
    put = Staging.put
    m.setattr(Staging, "put", lambda self, v, *a: uploads.append(len(v)) or put(self, v, *a))
    return uploads


def test_opening_a_slot_and_giving_it_text_wait_for_no_queued_work(
    tiny: Qwen3TTSModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    slot = 2
    sync_debug = tiny.device.type == "cuda"
    with _element_writes(monkeypatch) as seen:
        if sync_debug:
            torch.cuda.set_sync_debug_mode("error")
        try:
            tiny.open_slot(slot, StreamParams(seed=5))
            tiny.add_text(slot, ["Hello ", "there, "], False)
            tiny.add_text(slot, ["friend."], True)
        finally:
            if sync_debug:
                torch.cuda.set_sync_debug_mode(0)
            tiny.close_slot(slot)
    assert seen == []


def test_streamed_text_reaches_the_device_with_the_next_step_all_slots_in_one_copy(
    tiny: Qwen3TTSModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A word at a time is a push per word: each waits on the host, and the step copies what every
    slot got since the last one at once, where its feeds read it."""
    slots = (1, 3, 4)
    copies: list[tuple[int, ...]] = []
    copy = torch.Tensor.copy_

    def record(self: torch.Tensor, src: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        copies.append(tuple(src.shape))
        return copy(self, src, *args, **kwargs)

    try:
        for s in slots:
            tiny.open_slot(s, StreamParams(seed=s, forced_frames=8))
        flush(tiny)  # the opened rows: uploaded with the next step too (test below)
        with monkeypatch.context() as m:
            m.setattr(torch.Tensor, "copy_", record)
            for word in ("Hello ", "there, ", "my ", "good "):
                for s in slots:
                    tiny.add_text(s, [word], False)
            assert copies == []
            uploads = _count_uploads(m)
            tiny.generate_start(list(slots))()
            assert len(uploads) == 1  # every slot's ids, positions and lengths (the graphs' rows aside)
        for s in slots:
            ids = tiny._slot(s).fed_ids()
            assert int(tiny.state.text_len[s]) == len(ids)
            assert tiny.state.text[s, : len(ids)].tolist() == ids
        tiny.add_text(slots[0], ["friend."], True)
        tiny.generate_start([slots[0]])()
        ids = tiny._slot(slots[0]).fed_ids()
        assert tiny.state.text[slots[0], : len(ids)].tolist() == ids
        assert int(tiny.state.text_len[slots[0]]) == len(ids)
    finally:
        for s in slots:
            tiny.close_slot(s)


def test_opened_rows_reach_the_device_with_the_next_step_every_slot_at_once(
    tiny: Qwen3TTSModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each open's sampling row and flags wait on the host; the flush before a step writes every
    opened slot's at once (one upload), and zeroes the counters its previous owner left."""
    params = {
        1: StreamParams(seed=11, extra={"temperature": 0.7, "top_k": 5, "subtalker_top_p": 0.5}),
        3: StreamParams(seed=12, greedy=True, forced_frames=4, extra={"repetition_penalty": 1.3}),
        4: StreamParams(seed=2**32 - 1, extra={"whole_text": True, "top_k": 0}),
    }
    st = tiny.state
    for s in params:  # what a previous owner leaves
        for t in (st.seen, st.first_feed_pending):
            t[s] = True
        for t in (st.position, st.frames, st.text_len):
            t[s] = 7
    try:
        with monkeypatch.context() as m:
            uploads = _count_uploads(m)
            for s, p in params.items():
                tiny.open_slot(s, p)
            assert uploads == []
            flush(tiny)
            assert len(uploads) == 1  # the integers and the floats' bits of all three
        for s, p in params.items():
            want = parse_request(tiny.cfg, tiny.tokenizer, tiny.info.voices, s, p, tiny.random_weights).sampling
            assert st.greedy[s].tolist() == list(want.greedy)
            assert st.temperature[s].tolist() == torch.tensor(want.temperature, dtype=torch.float32).tolist()
            assert st.top_k[s].tolist() == list(want.top_k)
            assert st.top_p[s].tolist() == torch.tensor(want.top_p, dtype=torch.float32).tolist()
            assert float(st.penalty[s]) == torch.tensor(want.repetition_penalty, dtype=torch.float32).item()
            assert int(st.seed[s]) == want.seed
            assert bool(st.eos_masked[s]) == want.eos_always_masked
            assert bool(st.whole_text[s]) == bool(p.extra.get("whole_text", False))
            assert not st.seen[s].any() and not st.first_feed_pending[s]
            assert int(st.position[s]) == int(st.frames[s]) == int(st.text_len[s]) == 0
    finally:
        for s in params:
            tiny.close_slot(s)
