"""Which streams generate and which chunks decode, each tick. Plain Python: no model, no torch.

Policy: deadline first. A stream's deadline is the moment its listener would run dry if playback
started when its first audio left the engine (a stream with no audio yet is due since its first
text arrived, so new turns go first, oldest first). Generate batches are filled in deadline
order up to the model's batch size. A stream more than ``AHEAD_S`` ahead of its listener waits
while another tenant has a stream that is not (it has that much audio in hand; the other's next
audio is due sooner), and such streams never fill the last row of a batch: it stays for a turn
that comes in. When more are ready than fit, the batch is shared out across tenants (the
gateway's clients): each tenant's most urgent stream first, those due now before those with audio
in hand, and the tenants that used the least model time lately (``GenerateResult.compute_s``,
decayed over ``TENANT_COST_S``) first among each; so a tenant with many streams, or with text that
costs much to speak, cannot push another tenant's new turn out of every batch. A stream's frames
are handed to the decoder when its chunk schedule says the next chunk is complete, or when it has
finished.
"""

from __future__ import annotations

import math
import operator
import time
from dataclasses import dataclass, field

from .config import ChunkSchedule
from .model import DecodeWork, GenerateResult
from .word_timing import WordTiming, shifted

TENANT_COST_S = 2.0  # a tenant's model time counts against it for about this long
AHEAD_S = 6.0  # of audio a listener has in hand: such a stream waits while others need the batch


@dataclass
class Request:
    """Worker-side state of one stream. Owned by the worker thread."""

    stream_id: int
    slot: int
    t_arrival: float  # perf_counter of the first text (or of the open, until text comes)
    tenant: str = ""  # whose stream (StreamParams.tenant): batches share out across tenants
    first_chunk_frames: int | None = None
    sample_rate_hz: int = 24_000
    pending: list[object] = field(default_factory=list)  # frame payloads not yet decoded
    pending_frames: int = 0
    pending_text: list[str] = field(default_factory=list)  # text spoken by the pending frames
    pending_words: list[WordTiming] = field(default_factory=list)  # their words, frames from the first
    chunks_decoded: int = 0
    stepped: bool = False  # planned into a frame step (its first frame made or under way)
    generation_done: bool = False  # the model will produce no more frames
    final_sent: bool = False
    t_first_emit: float | None = None  # perf_counter when the first audio left the engine
    samples_emitted: int = 0

    def deadline(self) -> float:
        if self.t_first_emit is None:
            return self.t_arrival
        return self.t_first_emit + self.samples_emitted / self.sample_rate_hz


@dataclass(frozen=True)
class StepPlan:
    """Stage-1 work of one tick: the slots that run one generate step, most urgent first."""

    generate_slots: list[int]
    generate_streams: list[int]  # stream ids, same order

    @property
    def empty(self) -> bool:
        return not self.generate_slots


class Scheduler:
    def __init__(
        self, chunks: ChunkSchedule, max_batch_size: int, wait_rows: int = 0, wait_slack_s: float = 0.0
    ) -> None:
        self._chunks = chunks
        self._max_batch = max_batch_size
        self._wait_rows, self._wait_slack_s = wait_rows, wait_slack_s  # can_wait
        self.requests: dict[int, Request] = {}
        self._cost: dict[str, tuple[float, float]] = {}  # tenant -> (model seconds, when), decaying

    def add(self, request: Request) -> None:
        self.requests[request.stream_id] = request

    def remove(self, stream_id: int) -> Request | None:
        return self.requests.pop(stream_id, None)

    def plan_generate(self, ready: set[int]) -> StepPlan:
        """``ready``: stream ids whose model slot can make progress now."""
        # (deadline, request) of each candidate, each deadline computed once; a stable sort on the
        # deadline alone keeps ties in the order the streams were added
        keyed = [(r.deadline(), r) for r in self.requests.values() if r.stream_id in ready and not r.generation_done]
        keyed.sort(key=_FIRST)
        now = time.perf_counter()
        candidates = keyed
        ahead = [_ahead_by(d, r, now) for d, r in keyed]
        if any(ahead):
            due = {r.tenant for r in self.requests.values() if not r.generation_done and not self._ahead(r, now)}
            # An ahead stream stays when no other tenant has a stream that is not ahead, and ahead
            # streams fill all rows but one: one stays free for a turn that comes in, which would
            # otherwise wait for a row's work to end (nothing on a batch of hundreds; on the CPU
            # voice's two workers, one of its two calls of up to a few hundred ms).
            spare = max(1, self._max_batch - 1)
            kept = []
            for c, a in zip(candidates, ahead, strict=True):
                if a:
                    if not spare or not due <= {c[1].tenant}:
                        continue
                    spare -= 1
                kept.append(c)
            candidates = kept
        if len(candidates) <= self._max_batch:
            chosen = [r for _, r in candidates]
        else:
            chosen = self._fair(candidates, now)
        for r in chosen:
            r.stepped = True
        return StepPlan([r.slot for r in chosen], [r.stream_id for r in chosen])

    def has_new(self, ready: set[int]) -> bool:
        """Whether a stream of ``ready`` has had no frame step yet."""
        requests = self.requests
        return any(not r.stepped for sid in ready if (r := requests.get(sid)) is not None)

    def can_wait(self, ready: set[int]) -> bool:
        """Whether a frame step for ``ready`` may wait a moment (for codec work begun): at most
        ``wait_rows`` of them, none new (its first frame is the wait), none with audio that runs dry
        within ``wait_slack_s``, and none with no audio after more than one chunk (a quiet lead-in
        the trim held back: its audible start is still to come). One with its first chunk decoded
        and no audio may wait: that chunk is on the codec, which is what the step waits for."""
        if len(ready) > self._wait_rows:
            return False
        now = time.perf_counter()
        for sid in ready:
            r = self.requests.get(sid)
            if r is None:
                continue
            if not r.stepped:
                return False
            if r.chunks_decoded > 1 if r.t_first_emit is None else r.deadline() - now < self._wait_slack_s:
                return False
        return True

    def _fair(self, candidates: list[tuple[float, Request]], now: float) -> list[Request]:
        """A full batch from deadline-ordered (deadline, request) ``candidates``: a round of each
        tenant's most urgent stream, then a round of each one's next, ...; within a round those due
        now (a new turn, a listener running dry) before those with audio in hand, and the tenant
        that used the least model time first among each. One tenant alone: the ``max_batch`` most
        urgent, as without tenants."""
        tenant = candidates[0][1].tenant
        if all(r.tenant == tenant for _, r in candidates):
            return [r for _, r in candidates[: self._max_batch]]  # one tenant: its rounds are deadline order
        rounds: dict[str, int] = {}
        cost: dict[str, float] = {}  # each tenant's, once
        ranked = []
        for i, (deadline, r) in enumerate(candidates):
            n = rounds.get(r.tenant, 0)
            rounds[r.tenant] = n + 1
            c = cost.get(r.tenant)
            if c is None:
                c = cost[r.tenant] = self._tenant_cost(r.tenant, now)
            ranked.append((n, deadline > now, c, i, r))
        ranked.sort(key=operator.itemgetter(0, 1, 2, 3))
        return [x[4] for x in ranked[: self._max_batch]]

    @staticmethod
    def _ahead(r: Request, now: float) -> bool:
        return _ahead_by(r.deadline(), r, now)

    def _tenant_cost(self, tenant: str, now: float) -> float:
        cost, t = self._cost.get(tenant, (0.0, now))
        return cost * math.exp((t - now) / TENANT_COST_S)

    def record(self, plan: StepPlan, results: list[GenerateResult]) -> None:
        now = time.perf_counter()
        requests = self.requests
        for stream_id, res in zip(plan.generate_streams, results, strict=True):
            req = requests.get(stream_id)
            if req is None:
                continue
            if res.compute_s:
                self._cost[req.tenant] = (self._tenant_cost(req.tenant, now) + res.compute_s, now)
            if res.n_frames:
                req.pending_words += shifted(res.words, req.pending_frames)
                req.pending.append(res.frames)
                req.pending_frames += res.n_frames
                if res.text_spoken:
                    req.pending_text.append(res.text_spoken)
            if res.finished:
                req.generation_done = True
        if len(self._cost) > 1024:  # tenants come and go: keep those whose cost still counts
            self._cost = {k: v for k, v in self._cost.items() if now - v[1] < 10 * TENANT_COST_S}

    def plan_decode(self, now: float | None = None) -> list[DecodeWork]:
        """Chunks complete at ``now`` (perf_counter; default: now), per the chunk schedule (or flushed
        because generation finished), most urgent first."""
        now = time.perf_counter() if now is None else now
        chunks = self._chunks
        ready: list[tuple[float, Request, float]] = []  # (deadline, request, slack) of each due chunk
        for req in self.requests.values():
            if req.final_sent:
                continue
            if not req.generation_done and req.pending_frames < chunks.least_frames(
                req.chunks_decoded, req.first_chunk_frames
            ):
                continue  # short of the chunk at any slack (most streams, most ticks)
            deadline = req.deadline()
            slack_s = deadline - now if req.t_first_emit is not None else 0.0
            need = chunks.frames_for(req.chunks_decoded, req.first_chunk_frames, slack_s)
            if req.pending_frames >= need or req.generation_done:
                ready.append((deadline, req, slack_s))
        # deadline order; the sort is stable, so ties keep the order the streams were added
        ready.sort(key=_FIRST)
        due: list[DecodeWork] = []
        for _, req, slack_s in ready:
            due.append(
                DecodeWork(
                    stream_id=req.stream_id,
                    slot=req.slot,
                    frames=req.pending,
                    n_frames=req.pending_frames,
                    final=req.generation_done,
                    text=" ".join(req.pending_text),
                    words=tuple(req.pending_words),
                    slack_s=slack_s,
                )
            )
            req.pending = []
            req.pending_frames = 0
            req.pending_text = []
            req.pending_words = []
            req.chunks_decoded += 1
            if req.generation_done:
                req.final_sent = True
        return due


_FIRST = operator.itemgetter(0)  # (deadline, ...) tuples by deadline


def _ahead_by(deadline: float, r: Request, now: float) -> bool:
    """``r`` (its ``deadline()`` given) has played out more than AHEAD_S beyond ``now``."""
    return r.t_first_emit is not None and deadline - now > AHEAD_S
