"""A new stream's device writes are queued, never waited for.

``t[i] = value`` on a CUDA tensor copies one element from pageable memory, which waits for all the
work queued on the stream: the frame steps in flight. The worker opens streams between steps, so
every open would hold it until the device ran dry (on the H200 at 240 req/s the commands took 4.45
ms of an 11-ms tick). A slot's open, its text and its codec state reset therefore write scalars by
``fill_`` and lists through pinned memory. Checked on the CPU, where the same code runs, by the
pattern; on CUDA (``VOICEWIRE_TEST_DEVICE=cuda``) also by torch's sync debug mode.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from voicewire.engine.model import StreamParams
from voicewire.engine.qwen3.model import Qwen3TTSModel


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
