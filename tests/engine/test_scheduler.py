"""The scheduler is plain Python: tested with fake generate results, no model, no torch."""

import random
import time

from voicewire.engine.config import ChunkSchedule
from voicewire.engine.model import GenerateResult
from voicewire.engine.scheduler import AHEAD_S, Request, Scheduler


def _req(sid: int, t: float) -> Request:
    return Request(stream_id=sid, slot=sid + 100, t_arrival=t)


def test_deadline_first_and_batch_limit() -> None:
    s = Scheduler(ChunkSchedule(), max_batch_size=2)
    playing = _req(1, t=0.0)
    playing.t_first_emit, playing.samples_emitted = 0.0, 24_000 * 5  # 5 s buffered: runs dry at t=5
    new = _req(2, t=1.0)  # no audio yet: due since its text arrived
    newer = _req(3, t=2.0)
    for r in (playing, new, newer):
        s.add(r)
    plan = s.plan_generate({1, 2, 3})
    assert plan.generate_streams == [2, 3]
    assert plan.generate_slots == [102, 103]
    assert s.plan_generate({1}).generate_streams == [1]  # only ready streams


def test_a_stream_far_ahead_of_its_listener_gets_longer_chunks() -> None:
    sched = ChunkSchedule(slack_frames=((2.0, 24), (6.0, 48)))
    assert [sched.frames_for(i, slack_s=0.5) for i in range(7)] == [1, 2, 4, 8, 12, 12, 12]
    assert [sched.frames_for(i, slack_s=3.0) for i in range(6)] == [1, 24, 24, 24, 24, 24]
    assert sched.frames_for(0, slack_s=60.0) == 1  # the first chunk stays small whatever the slack
    assert sched.frames_for(9, slack_s=6.0) == 48
    s = Scheduler(sched, max_batch_size=1)
    r = _req(1, 0.0)
    r.t_first_emit, r.samples_emitted, r.chunks_decoded = 100.0, 24_000 * 4, 5  # runs dry at t=104
    s.add(r)
    for step in range(23):
        s.record(s.plan_generate({1}), [GenerateResult(r.slot, f"f{step}", 1, False, text_spoken="")])
    assert s.plan_decode(now=101.0) == []  # 3 s ahead: waits for 24 frames
    (chunk,) = s.plan_decode(now=103.0)  # 1 s ahead: 12 are enough
    assert chunk.n_frames == 23


def test_chunk_schedule_first_then_ramp_then_final_flush() -> None:
    s = Scheduler(ChunkSchedule(first_frames=1, ramp_frames=(2,), steady_frames=3), max_batch_size=4)
    r = _req(1, 0.0)
    s.add(r)
    sizes = []
    for step in range(8):
        plan = s.plan_generate({1})
        finished = step == 7
        s.record(plan, [GenerateResult(r.slot, f"f{step}", 1, finished, text_spoken="")])
        sizes += [c.n_frames for c in s.plan_decode()]
    # 8 frames: 1, 2, 3, then the final flush of the remaining 2
    assert sizes == [1, 2, 3, 2]
    assert r.final_sent


def test_per_request_first_chunk_override() -> None:
    s = Scheduler(ChunkSchedule(first_frames=1), max_batch_size=1)
    r = _req(1, 0.0)
    r.first_chunk_frames = 2
    s.add(r)
    s.record(s.plan_generate({1}), [GenerateResult(r.slot, "a", 1, False)])
    assert s.plan_decode() == []
    s.record(s.plan_generate({1}), [GenerateResult(r.slot, "b", 1, False)])
    (chunk,) = s.plan_decode()
    assert chunk.frames == ["a", "b"] and not chunk.final


def test_finished_with_no_frames_still_sends_final() -> None:
    s = Scheduler(ChunkSchedule(), max_batch_size=1)
    r = _req(1, 0.0)
    s.add(r)
    s.record(s.plan_generate({1}), [GenerateResult(r.slot, None, 0, True)])
    (chunk,) = s.plan_decode()
    assert chunk.final and chunk.n_frames == 0
    assert s.plan_decode() == []


def test_a_full_batch_is_shared_across_tenants() -> None:
    s = Scheduler(ChunkSchedule(), max_batch_size=2)
    for sid in range(6):  # one tenant's six streams, all behind their listeners
        heavy = Request(stream_id=sid, slot=sid, t_arrival=0.0, tenant="heavy")
        heavy.t_first_emit, heavy.samples_emitted = float(sid), 0
        s.add(heavy)
    s.add(Request(stream_id=9, slot=9, t_arrival=50.0, tenant="newcomer"))  # a new turn, due last
    ready = set(s.requests)
    assert s.plan_generate(ready).generate_streams == [0, 9]  # the heavy one's most urgent, then the newcomer's
    # one tenant alone (or no tenants): the most urgent fill the batch, as before
    assert s.plan_generate(ready - {9}).generate_streams == [0, 1]


def test_the_tenant_that_used_the_least_model_time_goes_first() -> None:
    s = Scheduler(ChunkSchedule(), max_batch_size=1)
    costly = Request(stream_id=1, slot=1, t_arrival=0.0, tenant="costly")
    cheap = Request(stream_id=2, slot=2, t_arrival=1.0, tenant="cheap")  # due later
    s.add(costly)
    s.add(cheap)
    assert s.plan_generate({1, 2}).generate_streams == [1]  # no cost yet: deadline first
    s.record(s.plan_generate({1}), [GenerateResult(1, "f", 1, False, compute_s=0.5)])
    assert s.plan_generate({1, 2}).generate_streams == [2]


def test_a_stream_far_ahead_waits_while_another_tenants_is_due() -> None:
    import time

    s = Scheduler(ChunkSchedule(), max_batch_size=4)
    ahead = Request(stream_id=1, slot=1, t_arrival=0.0, tenant="reader")
    ahead.t_first_emit, ahead.samples_emitted = time.perf_counter(), 24_000 * 20  # 20 s in hand
    s.add(ahead)
    assert s.plan_generate({1}).generate_streams == [1]  # alone: it generates on (a download)
    s.add(Request(stream_id=2, slot=2, t_arrival=time.perf_counter(), tenant="caller"))
    assert s.plan_generate({1, 2}).generate_streams == [2]  # room in the batch, but the caller is due
    s.add(Request(stream_id=3, slot=3, t_arrival=time.perf_counter(), tenant="reader"))
    assert s.plan_generate({1, 3}).generate_streams == [3]  # the caller's, though not ready, still counts


def test_streams_far_ahead_leave_a_row_for_a_turn_that_comes_in() -> None:
    s = Scheduler(ChunkSchedule(), max_batch_size=3)
    for sid in range(4):
        reader = Request(stream_id=sid, slot=sid, t_arrival=0.0, tenant="reader")
        # 20+ s in hand
        reader.t_first_emit, reader.samples_emitted = time.perf_counter(), 24_000 * (20 + sid)
        s.add(reader)
    assert s.plan_generate({0, 1, 2, 3}).generate_streams == [0, 1]  # two of three rows
    s.add(Request(stream_id=9, slot=9, t_arrival=time.perf_counter(), tenant="reader"))
    assert s.plan_generate({0, 1, 9}).generate_streams == [9, 0, 1]  # the new turn takes the row left
    one = Scheduler(ChunkSchedule(), max_batch_size=1)
    one.add(s.requests[0])
    assert one.plan_generate({0}).generate_streams == [0]  # a batch of one still runs


def test_within_a_round_a_due_stream_goes_before_one_with_audio_in_hand() -> None:
    s = Scheduler(ChunkSchedule(), max_batch_size=1)
    talker = Request(stream_id=1, slot=1, t_arrival=0.0, tenant="talker")
    s.add(talker)
    s.record(s.plan_generate({1}), [GenerateResult(1, "f", 1, False, compute_s=0.5)])  # the costly tenant
    playing = Request(stream_id=2, slot=2, t_arrival=0.0, tenant="cheap")
    playing.t_first_emit, playing.samples_emitted = time.perf_counter(), 24_000 * 2  # 2 s in hand
    s.add(playing)
    s.remove(1)
    s.add(Request(stream_id=3, slot=3, t_arrival=time.perf_counter(), tenant="talker"))  # its next turn
    assert s.plan_generate({2, 3}).generate_streams == [3]  # due now, though its tenant cost more
    late = Request(stream_id=4, slot=4, t_arrival=0.0, tenant="cheap")
    late.t_first_emit = time.perf_counter() - 1.0  # its listener ran dry a second ago
    s.add(late)
    assert s.plan_generate({3, 4}).generate_streams == [4]  # both due: the cheaper tenant's


def test_least_frames_is_the_chunk_at_no_slack_and_never_more_than_any_slack_asks() -> None:
    sched = ChunkSchedule(slack_frames=((0.0, 3), (2.0, 24), (6.0, 48)))
    for i in range(8):
        for first in (None, 2):
            least = sched.least_frames(i, first)
            assert least == ChunkSchedule().frames_for(i, first)  # the same chunks without slack sizes
            assert all(least <= sched.frames_for(i, first, s) for s in (-1.0, 0.0, 1.0, 3.0, 9.0))


def test_plans_equal_sorting_every_stream_by_deadline_first() -> None:
    """The plans look at each stream once and sort only what they choose: the same batches and
    chunks, in the same order (ties too), as sorting every stream by deadline and then choosing."""
    rnd = random.Random(0)
    sched = ChunkSchedule(slack_frames=((2.0, 24), (6.0, 48)))
    for trial in range(30):
        s = Scheduler(sched, max_batch_size=rnd.choice((2, 8, 64)))
        for sid in range(40):
            r = Request(stream_id=sid, slot=sid, t_arrival=float(rnd.randint(0, 5)), tenant=rnd.choice("ab"))
            if rnd.random() < 0.6:  # playing: deadlines tie now and then, some far ahead
                r.t_first_emit, r.samples_emitted = float(rnd.randint(0, 3)), 24_000 * rnd.choice((0, 1, 8, 30))
            r.chunks_decoded, r.first_chunk_frames = rnd.randint(0, 6), rnd.choice((None, 2))
            r.pending, r.pending_frames = ["f"] * (n := rnd.randint(0, 30)), n
            r.generation_done = rnd.random() < 0.2
            r.final_sent = r.generation_done and rnd.random() < 0.3
            s.add(r)
        ready = {sid for sid in s.requests if rnd.random() < 0.7}
        now = 3.0 + trial
        everyone = sorted(s.requests.values(), key=Request.deadline)  # stable: ties in the order added
        ahead = {r.stream_id for r in everyone if r.t_first_emit is not None and r.deadline() - time.perf_counter() > AHEAD_S}
        want_gen = [r.stream_id for r in everyone if r.stream_id in ready and not r.generation_done]
        if not ahead & set(want_gen) and len(want_gen) <= s._max_batch:  # no stream held back, no share
            assert s.plan_generate(ready).generate_streams == want_gen
        want_dec = [
            r.stream_id
            for r in everyone
            if not r.final_sent
            and (
                r.generation_done
                or r.pending_frames
                >= sched.frames_for(r.chunks_decoded, r.first_chunk_frames, r.deadline() - now if r.t_first_emit is not None else 0.0)
            )
        ]
        assert [d.stream_id for d in s.plan_decode(now)] == want_dec


def test_a_step_may_wait_only_for_streams_with_audio_in_hand() -> None:
    s = Scheduler(ChunkSchedule(), max_batch_size=8, wait_rows=2, wait_slack_s=0.2)
    now = time.perf_counter()
    playing = _req(1, now - 5)
    playing.t_first_emit, playing.samples_emitted = now - 1, 24_000 * 3  # 2 s in hand
    first_out = _req(2, now)  # stepped, its first chunk on the codec: no audio yet
    first_out.chunks_decoded = 1
    new = _req(3, now)  # no frame step yet
    dry = _req(4, now - 5)
    dry.t_first_emit, dry.samples_emitted = now - 1, int(24_000 * 1.05)  # 50 ms in hand
    for r in (playing, first_out, new, dry):
        s.add(r)
    assert s.has_new({1, 2, 3, 4})
    s.plan_generate({1, 2, 4})  # planned into a step: no longer new
    assert not s.has_new({1, 2, 4}) and s.has_new({3})
    assert s.can_wait({1, 2})
    assert not s.can_wait({1, 2, 5})  # more rows than wait_rows (5 is not a stream: still a row)
    assert not s.can_wait({1, 3})  # a new stream's first frame
    assert not s.can_wait({1, 4})  # runs dry within the slack
    first_out.chunks_decoded = 2  # no audio after two chunks: a lead-in the trim held back
    assert not s.can_wait({1, 2})
    first_out.chunks_decoded = 1
    lenient = Scheduler(ChunkSchedule(), max_batch_size=8, wait_rows=2, wait_slack_s=0.01)
    lenient.add(playing)
    lenient.add(dry)
    assert lenient.can_wait({1, 4})
