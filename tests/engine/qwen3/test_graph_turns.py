"""Start-up's warm-up and capture (cuda_graphs.in_turns): lanes warm at once on threads of their own,
then every body is captured on the thread that warmed it, one at a time, in the global order, after
every warm-up has ended. torch keeps cuDNN's timed conv algorithms per thread, so a body captured
on another thread than the one that warmed it would be timed again inside the capture (which
invalidates it); and a capture must see no other thread's work."""

from __future__ import annotations

import threading
import time

import pytest

from voicewire.engine.qwen3.cuda_graphs import in_turns


def test_each_item_is_captured_on_the_thread_that_warmed_it_in_order_after_every_warm_up() -> None:
    lanes = [["a1", "a2"], ["b1"], ["c1", "c2", "c3"]]
    order = ["c1", "a1", "b1", "c2", "a2", "c3"]  # largest first, across lanes
    warmed_on: dict[str, str] = {}
    captured: list[tuple[str, str]] = []
    events: list[str] = []
    busy = threading.Lock()  # held by a capture: nothing else may run then

    def warm(items: list[str]) -> None:
        time.sleep(0.05 * len(items))  # lanes end their warm-ups at different times
        for item in items:
            warmed_on[item] = threading.current_thread().name
        events.append("warm")

    def capture(item: str) -> None:
        assert busy.acquire(blocking=False), "two captures at once"
        try:
            time.sleep(0.01)
            captured.append((item, threading.current_thread().name))
            events.append("capture")
        finally:
            busy.release()

    in_turns(lanes, order, warm, capture, warmed=lambda: events.append("all warm"))
    assert [item for item, _ in captured] == order
    assert all(thread == warmed_on[item] for item, thread in captured)
    assert len({thread for _, thread in captured}) == 3
    assert events == ["warm"] * 3 + ["all warm"] + ["capture"] * 6


def test_a_failing_lane_stops_every_lane_and_raises() -> None:
    captured: list[str] = []

    def warm(items: list[str]) -> None:
        if "bad" in items:
            raise ValueError("warm-up failed")

    with pytest.raises(ValueError, match="warm-up failed"):
        in_turns([["ok"], ["bad"]], ["ok", "bad"], warm, captured.append)
    assert captured == []

    def capture(item: str) -> None:
        if item == "x2":
            raise RuntimeError("capture failed")
        captured.append(item)

    with pytest.raises(RuntimeError, match="capture failed"):
        in_turns([["x1", "x3"], ["x2"]], ["x1", "x2", "x3"], lambda items: None, capture)
    assert captured == ["x1"]  # nothing after the failed capture
