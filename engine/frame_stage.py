"""Stage 1 as the worker drives it: frame steps begun on the model and not yet taken, oldest first,
at most ``ahead`` at once (the pipeline in engine.py's docstring). A begun step's slots stay taken
until its results are in (slots.py): the slots released meanwhile come back when it is taken.

The step queued behind the running one is planned as late as it can be (``lead_s``): its rows are
fixed when it is begun, so a turn that comes in after that waits for it and for the next one too.
The worker holds the begin until the running step is due to end in ``lead_s`` plus the time a
begin takes, taking commands meanwhile (a new turn then joins the step about to run). A step's
time is learnt from the steps before it of about as many rows: each from the end of the step
before it, or its own begin where that was later, to its end as the waiting worker saw it.
A running step seen done ends the hold at once, so a wrong guess costs at most one begin's gap."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from .codec_work import POLL_S, CodecWork
from .model import GenerateResult, Model, Queued
from .scheduler import StepPlan
from .slots import SlotPool

# the weight of the newest sample in a step's learnt time (and a begin's): steps of a load change
# with it over a few steps, and one step slowed by the codec beside it must not move the guess much
EMA_NEW = 0.2


class Begun(NamedTuple):
    plan: StepPlan
    results: Queued[list[GenerateResult]]
    at: float  # perf_counter once the step was queued on the device


class FrameStage:
    def __init__(
        self,
        codec: CodecWork,
        record: Callable[[StepPlan, list[GenerateResult]], None],
        failed: Callable[[StepPlan, Exception], None],
        freed: Callable[[list[int]], None],
    ) -> None:
        self._steps: deque[Begun] = deque()
        self.ahead = 1  # frame steps begun at once: set by Engine.start from the config and the model
        self.ahead_min_rows = 0  # the rows a step needs for another to be queued behind it (Engine.start)
        self.lead_s: float | None = None  # EngineConfig.queue_ahead_lead_s (Engine.start); None: no hold
        self.held_s = 0.0  # the worker's time holding a begin back (a wait on the device, too)
        self._step_s: dict[int, float] = {}  # a step's device seconds, by its rows' bit length
        self._begin_s = 0.0  # host seconds from a hold's end to the step's being queued
        self._released: float | None = None  # when the last hold ended, until a step is begun
        self._last_done = 0.0  # when the last step taken was seen done
        self._codec = codec  # its urgent pieces are handed out while a step is waited for
        self._record = record  # a step's results, to its streams and the scheduler
        self._failed = failed  # a step that failed to begin or to finish: its streams fail
        self._freed = freed  # slots released during steps, now free to close and reuse

    def __len__(self) -> int:
        return len(self._steps)

    def has_room(self) -> bool:
        if not self._steps:
            return True
        return len(self._steps) < self.ahead and len(self._steps[-1].plan.generate_slots) >= self.ahead_min_rows

    def begin_in(self, now: float) -> float:
        """Seconds the next step's begin is held back (module docstring); 0: begin it now."""
        if self.lead_s is None or len(self._steps) != 1 or not self.has_room():
            return 0.0
        plan, results, at = self._steps[0]
        step_s = self._step_s.get(len(plan.generate_slots).bit_length())
        if step_s is None or results.done():
            return 0.0
        return max(at, self._last_done) + step_s - self._begin_s - self.lead_s - now

    def hold(self, take_commands: Callable[[float], bool]) -> bool:
        """Until the next step's begin is due, commands taken (``take_commands(wait_s)``) and codec
        work handed out as it is done; True when commands came in."""
        t0 = now = time.perf_counter()
        came = False
        while (left := self.begin_in(now)) > 0:
            came |= take_commands(min(left, POLL_S))
            self._codec.take(wait=False)
            now = time.perf_counter()
        if now > t0:
            self.held_s += now - t0
            self._released = now
        return came

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
        now = time.perf_counter()
        if self._released is not None:  # the host time the hold's lead must cover
            self._begin_s += EMA_NEW * (now - self._released - self._begin_s)
            self._released = None
        self._steps.append(Begun(plan, results, now))
        return True

    def finish(self, slots: SlotPool) -> None:
        """The oldest begun step's results recorded, and the slots freed during it given back."""
        plan, results, at = self._steps.popleft()
        self._released = None  # a hold that began no step: the next begin's time is not its
        rows = len(plan.generate_slots)
        # a step the next one may be held for (begin_in) is waited for by looking at it, so its end
        # is seen as it comes and its time learnt
        timed = self.lead_s is not None and rows >= self.ahead_min_rows and not results.done()
        # urgent codec work that ends while the step runs is handed out then, not after the step:
        # it is done within a few ms, well before a loaded step
        while (timed or self._codec.urgent_out()) and not results.done():
            if not self._codec.take(wait=False):
                self._codec.poll()
        seen = time.perf_counter() if results.done() else None  # else the call below waits for it
        try:
            try:
                done = results()
            except Exception as err:
                self._failed(plan, err)
                return
            start = max(at, self._last_done)
            self._last_done = time.perf_counter() if seen is None else seen
            if timed:
                self._learn(rows, self._last_done - start)
            self._record(plan, done)
        finally:
            self._freed(slots.step_done())

    def _learn(self, rows: int, step_s: float) -> None:
        key = rows.bit_length()
        was = self._step_s.get(key)
        self._step_s[key] = step_s if was is None else was + EMA_NEW * (step_s - was)
