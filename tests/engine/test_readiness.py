"""The worker's ready set, kept up to date by marks, equals asking every stream (readiness.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from voicewire.engine.readiness import Readiness
from voicewire.engine.scheduler import Request

MAX_AHEAD = 100


class _Model:
    def __init__(self) -> None:
        self.slots: dict[int, bool] = {}
        self.asked: list[int] = []

    def ready(self, slot: int) -> bool:
        self.asked.append(slot)
        return self.slots[slot]


def _live(sid: int) -> Any:
    return SimpleNamespace(request=Request(stream_id=sid, slot=sid + 10, t_arrival=0.0), stream=SimpleNamespace(consumed_samples=0))


def _asked_all(live: dict[int, Any], model: _Model) -> set[int]:
    """What Engine asked before the set was kept: every live stream, every time."""
    return {
        sid
        for sid, lv in live.items()
        if not lv.request.generation_done
        and lv.request.samples_emitted - lv.stream.consumed_samples < MAX_AHEAD
        and model.slots[lv.request.slot]
    }


def test_marked_streams_are_asked_again_and_the_set_equals_asking_all() -> None:
    model, ready = _Model(), Readiness()
    live = {sid: _live(sid) for sid in (1, 2, 3, 4)}
    model.slots = {11: True, 12: False, 13: True, 14: True}
    ready.mark(live)
    assert ready.current(cast(Any, live), cast(Any, model), MAX_AHEAD) == _asked_all(live, model) == {1, 3, 4}
    model.asked.clear()
    assert ready.current(cast(Any, live), cast(Any, model), MAX_AHEAD) == {1, 3, 4}
    assert model.asked == []  # nothing happened: nobody asked
    model.slots[12], model.slots[13] = True, False  # text for 2, a step that ended 3's frames
    live[4].request.generation_done = True
    ready.mark((2, 3, 4))
    assert ready.current(cast(Any, live), cast(Any, model), MAX_AHEAD) == _asked_all(live, model) == {1, 2}
    assert sorted(model.asked) == [12, 13]  # 4 is done: its slot is not asked
    del live[1]
    ready.drop(1)
    assert ready.current(cast(Any, live), cast(Any, model), MAX_AHEAD) == {2}


def test_a_stream_far_ahead_of_its_caller_is_asked_every_time() -> None:
    model, ready = _Model(), Readiness()
    live = {1: _live(1)}
    model.slots = {11: True}
    live[1].request.samples_emitted = MAX_AHEAD
    ready.mark((1,))
    assert ready.current(cast(Any, live), cast(Any, model), MAX_AHEAD) == set()
    live[1].stream.consumed_samples = 1  # the caller's loop took some audio: no mark from the worker
    assert ready.current(cast(Any, live), cast(Any, model), MAX_AHEAD) == _asked_all(live, model) == {1}
    model.asked.clear()
    assert ready.current(cast(Any, live), cast(Any, model), MAX_AHEAD) == {1}
    assert model.asked == []  # caught up: no longer asked every time
