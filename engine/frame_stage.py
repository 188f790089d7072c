"""Stage 1 as the worker drives it: frame steps begun on the model and not yet taken, oldest first,
at most ``ahead`` at once (the pipeline in engine.py's docstring), and new streams' first frames on
the model's first lane (Model.first_start), taken as soon as each is done, whatever began before. A
begun step's slots stay taken until its results are in (slots.py): the slots released meanwhile
come back when it is taken."""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable

from .codec_work import CodecWork
from .config import EngineConfig
from .model import GenerateResult, Model, Queued
from .scheduler import StepPlan
from .slots import SlotPool


class FrameStage:
    def __init__(
        self,
        codec: CodecWork,
        record: Callable[[StepPlan, list[GenerateResult]], None],
        failed: Callable[[StepPlan, Exception], None],
        freed: Callable[[list[int]], None],
        firsts_taken: Callable[[], None],
        plan: Callable[[set[int]], StepPlan],
    ) -> None:
        self._steps: deque[tuple[StepPlan, Queued[list[GenerateResult]], frozenset[int]]] = deque()
        self._firsts: list[tuple[StepPlan, Queued[list[GenerateResult]], frozenset[int]]] = []
        self.ahead = 1  # frame steps begun at once (configure)
        self.ahead_min_rows = 0  # the rows a step needs for another to be queued behind it
        self.first_lane_below_rows = 0  # the first lane is taken while the last step had fewer rows
        self._last_rows = 0  # of the last step begun
        self._codec = codec  # its urgent pieces are handed out while a step is waited for
        self._record = record  # a step's results, to its streams and the scheduler
        self._failed = failed  # a step that failed to begin or to finish: its streams fail
        self._freed = freed  # slots released during steps, now free to close and reuse
        self._firsts_taken = firsts_taken  # first frames recorded: their chunks go to the codec now
        self._plan = plan  # the scheduler's plan of the ready streams given, most urgent first
        self._unstepped: set[int] = set()  # streams in no step yet: the first lane's

    def configure(self, config: EngineConfig, steps_in_flight: int) -> None:
        """The pipeline's depth and the first lane's load bound from the config and the model."""
        self.ahead = max(1, steps_in_flight) if config.queue_ahead else 1
        self.ahead_min_rows = config.queue_ahead_min_rows
        self.first_lane_below_rows = config.first_lane_below_rows

    def __len__(self) -> int:
        return len(self._steps)

    @property
    def busy(self) -> bool:
        """Frame steps or first-lane calls begun and not yet taken."""
        return bool(self._steps or self._firsts)

    def opened(self, stream_id: int) -> None:
        self._unstepped.add(stream_id)

    def gone(self, stream_id: int) -> None:
        self._unstepped.discard(stream_id)

    def has_room(self) -> bool:
        if not self._steps:
            return True
        return len(self._steps) < self.ahead and len(self._steps[-1][0].generate_slots) >= self.ahead_min_rows

    def begin(self, model: Model, slots: SlotPool, plan: StepPlan) -> bool:
        """The step begun; False when there is nothing to run, or it failed to begin."""
        if plan.empty:
            return False
        try:
            results = model.generate_start(plan.generate_slots)
        except Exception as err:
            self._failed(plan, err)
            return False
        self._steps.append((plan, results, slots.step_started(plan.generate_slots)))
        self._unstepped.difference_update(plan.generate_streams)
        self._last_rows = len(plan.generate_slots)
        return True

    def begin_firsts(self, model: Model, slots: SlotPool, ready: set[int]) -> list[int]:
        """The most urgent ready streams in no step yet, up to ``model.first_lane_rows``, their first
        frames begun on the model's first lane (beside the steps in flight); returns their ids
        (empty when the model did not take them: then they go with the next step)."""
        new = ready & self._unstepped
        if not new or not model.first_lane_rows or self._last_rows >= self.first_lane_below_rows:
            return []
        full = self._plan(new)
        n = model.first_lane_rows
        plan = StepPlan(full.generate_slots[:n], full.generate_streams[:n])
        try:
            results = model.first_start(plan.generate_slots)
        except Exception as err:  # failed, not refused: the streams are told, not stepped again
            results = None
            self._failed(plan, err)
        if results is None:
            self._unstepped.difference_update(new)
            return []
        self._firsts.append((plan, results, slots.step_started(plan.generate_slots)))
        self._unstepped.difference_update(plan.generate_streams)
        return plan.generate_streams

    def take_firsts(self, slots: SlotPool, wait: bool = False) -> int:
        """The first-lane calls that are done (with ``wait``, all of them) recorded, their freed slots
        given back; then ``firsts_taken``. Returns how many were taken."""
        taken = 0
        for entry in list(self._firsts):
            plan, results, step = entry
            if not (wait or results.done()):
                continue
            self._firsts.remove(entry)
            taken += 1
            try:
                try:
                    done = results()
                except Exception as err:
                    self._failed(plan, err)
                    continue
                self._record(plan, done)
            finally:
                self._freed(slots.step_done(step))
        if taken:
            self._firsts_taken()
        return taken

    def finish_all(self, slots: SlotPool) -> None:
        """Every begun step and first-lane call taken, waiting for each."""
        while self._steps:
            self.finish(slots)
        self.take_firsts(slots, wait=True)

    def settle(self, slots: SlotPool) -> None:
        """Every begun step and first-lane call taken (shutdown), failures ignored."""
        while self._steps:
            with contextlib.suppress(Exception):
                self.finish(slots)
        with contextlib.suppress(Exception):
            self.take_firsts(slots, wait=True)

    def finish(self, slots: SlotPool) -> None:
        """The oldest begun step's results recorded, and the slots freed during it given back."""
        plan, results, step = self._steps.popleft()
        # urgent codec work and first frames that end while the step runs are taken then, not after
        # the step: they are done within a few ms, well before a loaded step
        while (self._codec.urgent_out() or self._firsts) and not results.done():
            if not (self._codec.take(wait=False) + self.take_firsts(slots)):
                self._codec.poll()
        try:
            try:
                done = results()
            except Exception as err:
                self._failed(plan, err)
                return
            self._record(plan, done)
        finally:
            self._freed(slots.step_done(step))
