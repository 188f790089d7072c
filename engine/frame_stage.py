"""Stage 1 as the worker drives it: frame steps begun on the model and not yet taken, oldest first,
at most ``ahead`` at once (the pipeline in engine.py's docstring). A begun step's slots stay taken
until its results are in (slots.py): the slots released meanwhile come back when it is taken."""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable

from .codec_work import CodecWork
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
    ) -> None:
        self._steps: deque[tuple[StepPlan, Queued[list[GenerateResult]]]] = deque()
        self.ahead = 1  # frame steps begun at once: set by Engine.start from the config and the model
        self.ahead_min_rows = 0  # the rows a step needs for another to be queued behind it (Engine.start)
        self.quiet_rows = 0  # a step of at most this many rows is a quiet device's (EngineConfig.quiet_rows)
        self._codec = codec  # its urgent pieces are handed out while a step is waited for
        self._record = record  # a step's results, to its streams and the scheduler
        self._failed = failed  # a step that failed to begin or to finish: its streams fail
        self._freed = freed  # slots released during steps, now free to close and reuse

    def __len__(self) -> int:
        return len(self._steps)

    def has_room(self, new: Callable[[], bool] = lambda: False) -> bool:
        """Whether a step may begin now: none is in flight, or fewer than ``ahead`` and the last of
        ``ahead_min_rows`` rows or more; behind a quiet one also when the step would make a
        stream's first frame (``new`` says), which then waits for that one only."""
        if not self._steps:
            return True
        if len(self._steps) >= self.ahead:
            return False
        rows = len(self._steps[-1][0].generate_slots)
        return rows >= self.ahead_min_rows or (rows <= self.quiet_rows and new())

    def wait_taking(self, take: Callable[[], bool]) -> bool:
        """Waits for the one step in flight while it is a quiet one with room behind it, calling
        ``take`` (the worker's commands, a short wait for them each) until it is done or ``take``
        says a stream came for its first frame: True then, and the step is left running so that
        stream's step is queued behind it. Urgent codec work done meanwhile is handed out."""
        if len(self._steps) != 1 or self.ahead < 2 or len(self._steps[0][0].generate_slots) > self.quiet_rows:
            return False
        results = self._steps[0][1]
        while not results.done():
            if take():
                return True
            if self._codec.urgent_out():
                self._codec.take(wait=False)
        return False

    def settle(self, slots: SlotPool) -> None:
        """Waits for every begun step, its results recorded (shutdown: the device idle after)."""
        while self._steps:
            with contextlib.suppress(Exception):
                self.finish(slots)

    def begin(self, model: Model, slots: SlotPool, plan: StepPlan) -> bool:
        """The step begun; False when there is nothing to run, or it failed to begin."""
        if plan.empty:
            return False
        try:
            results = model.generate_start(plan.generate_slots)
        except Exception as err:
            self._failed(plan, err)
            return False
        slots.step_started(plan.generate_slots)
        self._steps.append((plan, results))
        return True

    def finish(self, slots: SlotPool) -> None:
        """The oldest begun step's results recorded, and the slots freed during it given back."""
        plan, results = self._steps.popleft()
        # urgent codec work that ends while the step runs is handed out then, not after the step:
        # it is done within a few ms, well before a loaded step
        while self._codec.urgent_out() and not results.done():
            if not self._codec.take(wait=False):
                self._codec.poll()
        try:
            try:
                done = results()
            except Exception as err:
                self._failed(plan, err)
                return
            self._record(plan, done)
        finally:
            self._freed(slots.step_done())
