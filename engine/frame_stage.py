"""Stage 1 as the worker drives it: frame steps begun on the model and not yet taken, oldest first,
at most ``ahead`` at once (the pipeline in engine.py's docstring), and new streams' first frames on
the model's first lane (Model.first_start), taken as soon as each is done, whatever began before. A
begun step's slots stay taken until its results are in (slots.py): the slots released meanwhile
come back when it is taken."""

from __future__ import annotations

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
        firsts_taken: Callable[[], None],
    ) -> None:
        self._steps: deque[tuple[StepPlan, Queued[list[GenerateResult]], frozenset[int]]] = deque()
        self._firsts: list[tuple[StepPlan, Queued[list[GenerateResult]], frozenset[int]]] = []
        self.ahead = 1  # frame steps begun at once: set by Engine.start from the config and the model
        self.ahead_min_rows = 0  # the rows a step needs for another to be queued behind it (Engine.start)
        self._codec = codec  # its urgent pieces are handed out while a step is waited for
        self._record = record  # a step's results, to its streams and the scheduler
        self._failed = failed  # a step that failed to begin or to finish: its streams fail
        self._freed = freed  # slots released during steps, now free to close and reuse
        self._firsts_taken = firsts_taken  # first frames recorded: their chunks go to the codec now

    def __len__(self) -> int:
        return len(self._steps)

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
        return True

    @property
    def firsts_out(self) -> bool:
        """First-lane calls begun and not yet taken."""
        return bool(self._firsts)

    def begin_first(self, model: Model, slots: SlotPool, plan: StepPlan) -> bool:
        """New streams' first frames begun on the model's first lane; False when it does not take them."""
        try:
            results = model.first_start(plan.generate_slots)
        except Exception as err:
            self._failed(plan, err)
            return True  # failed, not refused: the streams are told, not stepped again
        if results is None:
            return False
        self._firsts.append((plan, results, slots.step_started(plan.generate_slots)))
        return True

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
