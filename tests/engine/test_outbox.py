"""Results to the streams' loops: one call per loop per batch, in the order posted (outbox.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from voicewire.engine.outbox import Outbox, _run_all


class _Loop:
    def __init__(self, closed: bool = False) -> None:
        self.closed = closed
        self.calls: list[tuple[Callable[..., None], tuple[Any, ...]]] = []

    def call_soon_threadsafe(self, fn: Callable[..., None], *args: Any) -> None:
        if self.closed:
            raise RuntimeError("Event loop is closed")
        self.calls.append((fn, args))

    def run(self) -> None:
        for fn, args in self.calls:
            fn(*args)


def test_calls_in_a_batch_go_as_one_per_loop_in_order_and_outside_at_once() -> None:
    lost: list[str] = []
    box, got = Outbox(lost.append), []
    a, b = _Loop(), _Loop()
    box.post(cast(Any, a), "s0", got.append, "first")
    assert len(a.calls) == 1  # outside a batch: at once
    with box.batch():
        for i in range(3):
            box.post(cast(Any, a), f"s{i}", got.append, f"a{i}")
            box.post(cast(Any, b), f"t{i}", got.append, f"b{i}")
        with box.batch():  # nested: goes with the outer one
            box.post(cast(Any, a), "s9", got.append, "a9")
        assert len(a.calls) == 1 and not b.calls
    assert len(a.calls) == 2 and len(b.calls) == 1
    a.run()
    b.run()
    assert got == ["first", "a0", "a1", "a2", "a9", "b0", "b1", "b2"]
    assert lost == []


def test_a_closed_loop_loses_every_stream_it_had_calls_for() -> None:
    lost: list[str] = []
    box = Outbox(lost.append)
    gone, fine = _Loop(closed=True), _Loop()
    box.post(cast(Any, gone), "x", print, "now")
    with box.batch():
        box.post(cast(Any, gone), "y", print, 1)
        box.post(cast(Any, fine), "z", print, 2)
        box.post(cast(Any, gone), "w", print, 3)
    assert lost == ["x", "y", "w"] and len(fine.calls) == 1


def test_one_failing_call_spares_the_rest() -> None:
    got: list[int] = []

    def boom(_: int) -> None:
        raise ValueError("stream gone")

    _run_all([(got.append, 1), (boom, 2), (got.append, 3)])
    assert got == [1, 3]
