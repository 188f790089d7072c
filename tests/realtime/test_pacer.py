"""The paced track on its own: real clock, real frames, no network."""

from __future__ import annotations

import asyncio
import time
from fractions import Fraction

import av
import numpy as np
import pytest
from aiortc.mediastreams import MediaStreamError

from voicewire.realtime.pacer import FRAME_SAMPLES, SAMPLE_RATE_HZ, PacedAudioTrack, Playback

FRAME_S = 0.020


def _tone(n_frames: int, amp: int = 8000) -> list[np.ndarray]:
    t = np.arange(n_frames * FRAME_SAMPLES) / SAMPLE_RATE_HZ
    pcm = (amp * np.sin(2 * np.pi * 440 * t)).astype("<i2")
    return [pcm[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES] for i in range(n_frames)]


async def _pull(track: PacedAudioTrack, n: int) -> tuple[list[float], list[np.ndarray], list[int]]:
    times, frames, pts = [], [], []
    for _ in range(n):
        frame = await track.recv()
        times.append(time.monotonic())
        frames.append(frame.to_ndarray().reshape(-1))
        pts.append(frame.pts)
    return times, frames, pts


async def test_frames_are_exact_20ms_on_the_wall_clock_with_contiguous_pts() -> None:
    track = PacedAudioTrack(encode=False)
    times, frames, pts = await _pull(track, 26)
    assert all(f.size == FRAME_SAMPLES for f in frames)
    assert pts == [i * FRAME_SAMPLES for i in range(26)]
    offsets_s = np.array(times) - times[0] - np.arange(26) * FRAME_S
    # Anchored to the first frame's time: never early, and no drift (a late frame must not move the
    # ones after it). One frame may be a few ms late when the 2 shared cores are busy elsewhere.
    assert offsets_s.min() > -0.001, "no frame before its time"
    assert np.median(np.abs(offsets_s)) < 0.002 and abs(offsets_s[-1]) < 0.005, "anchored clock: no drift"
    assert offsets_s.max() < 0.015, "no frame held back by the pacer itself"
    assert not any(f.any() for f in frames), "nothing queued: silence"
    track.stop()


async def test_turn_plays_in_order_and_drains_after_its_last_frame_was_taken() -> None:
    track = PacedAudioTrack(encode=False)
    pb = Playback()
    tone = _tone(5)
    for f in tone[:-1]:
        track.enqueue(pb, f)
    track.enqueue(pb, tone[-1], real_samples=300)  # zero-padded tail frame
    track.finish(pb)
    _, frames, _ = await _pull(track, 5)
    assert all(np.array_equal(a, b) for a, b in zip(frames, tone, strict=True))
    assert pb.played_samples == 4 * FRAME_SAMPLES + 300
    assert not pb.drained.is_set(), "the last frame is still with the sender"
    _, after, _ = await _pull(track, 1)
    assert pb.drained.is_set() and not after[0].any()
    track.stop()


async def test_an_idle_track_sends_the_first_audio_frame_at_once() -> None:
    track = PacedAudioTrack(encode=False)
    await _pull(track, 3)  # silence: the track is idle
    pb = Playback()

    async def enqueue_later() -> float:
        await asyncio.sleep(0.004)
        t = time.monotonic()
        for f in _tone(3):
            track.enqueue(pb, f)
        return t

    task = asyncio.create_task(enqueue_later())
    times, frames, _ = await _pull(track, 3)
    t_enqueued = await task
    assert frames[0].any()
    assert times[0] - t_enqueued < 0.003, "the first frame need not wait for its 20 ms slot"
    # then paced from there: the next frames on the first one's clock, never early, and no drift (one
    # may be late by a few ms when the 2 shared cores are busy elsewhere; the next catches up)
    offsets_s = np.array(times) - times[0] - np.arange(len(times)) * FRAME_S
    assert offsets_s.min() > -0.001 and abs(offsets_s[-1]) < 0.004, "then paced from there"
    assert track.stats.reanchors_idle == 1
    track.stop()


async def test_a_loop_stall_restarts_the_clock_instead_of_bursting() -> None:
    track = PacedAudioTrack(encode=False)
    pb = Playback()
    for f in _tone(20):
        track.enqueue(pb, f)
    await _pull(track, 3)
    time.sleep(0.1)  # blocks the loop: five slots are missed
    times, _, pts = await _pull(track, 6)
    gaps = np.diff(times)
    assert gaps.min() > FRAME_S - 0.004, f"burst after the stall: gaps {np.round(gaps * 1000, 1)} ms"
    assert track.stats.reanchors_stall == 1
    assert np.diff(pts).tolist() == [FRAME_SAMPLES] * 5, "the RTP clock stays contiguous"
    track.stop()


async def test_barge_in_flag_clears_the_queue_at_the_next_frame() -> None:
    track = PacedAudioTrack(encode=False)
    cancelled = False
    pb = Playback(is_cancelled=lambda: cancelled)
    for f in _tone(50):
        track.enqueue(pb, f)
    track.finish(pb)
    _, frames, _ = await _pull(track, 3)
    assert all(f.any() for f in frames)
    cancelled = True  # the session's Turn.cancelled, set by turn.cancel
    _, frames, _ = await _pull(track, 2)
    assert not frames[0].any() and not frames[1].any()
    assert pb.drained.is_set() and pb.played_samples == 3 * FRAME_SAMPLES
    assert track.queued_frames == 0
    track.stop()


async def test_drop_and_stop_release_waiters() -> None:
    track = PacedAudioTrack(encode=False)
    pb = Playback()
    for f in _tone(10):
        track.enqueue(pb, f)
    track.drop(pb)
    assert pb.drained.is_set() and track.queued_frames == 0
    track.enqueue(pb, _tone(1)[0])  # a dropped playback takes no more audio
    assert track.queued_frames == 0
    pb2 = Playback()
    for f in _tone(2):
        track.enqueue(pb2, f)
    track.finish(pb2)
    await track.recv()  # one frame with the sender, one queued
    recv = asyncio.create_task(track.recv())
    await asyncio.sleep(0.005)
    track.stop()
    with pytest.raises(MediaStreamError):
        await recv
    assert pb2.drained.is_set()
    with pytest.raises(ValueError):
        track.enqueue(Playback(), np.zeros(480, "<i2"))


async def test_the_peer_connections_track_hands_out_opus_packets_of_its_frames() -> None:
    track = PacedAudioTrack()  # what a peer connection sends
    pb = Playback()
    tone = _tone(10)
    for f in tone:
        track.enqueue(pb, f)
    decoder = av.CodecContext.create("libopus", "r")
    pts, decoded = [], []
    for _ in range(12):
        packet = await track.recv()
        assert isinstance(packet, av.Packet) and packet.time_base == Fraction(1, SAMPLE_RATE_HZ)
        pts.append(packet.pts)
        decoded.append(np.concatenate([f.to_ndarray().reshape(-1) for f in decoder.decode(packet)]))
    assert pts == [i * FRAME_SAMPLES for i in range(12)]
    level = [float(np.sqrt(np.mean(d.astype(np.float64) ** 2))) for d in decoded]
    # the tone's rms is 8000 / sqrt(2); Opus's look-ahead moves a few ms of it into the packets after
    assert min(level[2:9]) > 4000 and level[-1] < 500, f"frame levels {np.round(level)}"
    track.stop()
