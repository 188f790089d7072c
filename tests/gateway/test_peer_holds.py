"""A client's holds counted over processes (peer_holds.py): real processes taking at once, and the
holds of one that ended given back. The gateways end to end: tests/gateway/test_serve_workers.py."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from voicewire.realtime.peer_holds import PeerHolds, forget

pytestmark = pytest.mark.shared_cores  # counts over processes: nothing timed


def _take(peers_dir: str, start: multiprocessing.synchronize.Event, out: multiprocessing.Queue[int]) -> None:
    holds = PeerHolds(peers_dir)
    start.wait()
    out.put(sum(holds.take("addr:10.0.0.1", "sessions", 5) is not None for _ in range(20)))


def test_processes_taking_at_once_never_hold_more_than_the_quota(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    PeerHolds(tmp_path)  # the folder, as the first process makes it
    procs = [ctx.Process(target=_take, args=(str(tmp_path), start, out)) for _ in range(4)]
    for p in procs:
        p.start()
    start.set()
    taken = [out.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(10)
    assert 1 <= sum(taken) <= 5, taken
    assert len(list((tmp_path / "holds").glob("*/sessions.*"))) == sum(taken)


def test_kinds_and_clients_count_apart_and_a_hold_given_back_is_free_again(tmp_path: Path) -> None:
    holds = PeerHolds(tmp_path)
    first = [holds.take("addr:a", "sessions", 2) for _ in range(3)]
    assert first[2] is None and None not in first[:2]
    assert holds.take("addr:a", "speech", 2) is not None  # another kind
    assert holds.take("addr:b", "sessions", 2) is not None  # another client
    hold = first[0]
    assert hold is not None
    PeerHolds.give(hold)
    assert holds.take("addr:a", "sessions", 2) is not None


def test_the_holds_of_a_process_that_ended_are_given_back(tmp_path: Path) -> None:
    holds = PeerHolds(tmp_path)
    assert all(holds.take("addr:a", "sessions", 2) is not None for _ in range(2))
    assert holds.take("addr:a", "sessions", 2) is None
    forget(tmp_path, os.getpid())
    assert not list((tmp_path / "holds").iterdir())  # the client's folder went with its last hold
    assert holds.take("addr:a", "sessions", 2) is not None
