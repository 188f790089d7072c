"""GPU checks (skipped without CUDA): fp32 equals the CPU, the real-size codec streams exactly, bf16 is close.

The full GPU report (parity with the official package in fp32 and bf16, speed) is
benchmarks/gpu_qwen3_check.py; these are the pytest-sized part. TF32 is switched off: fp32 must
mean fp32 for the 1e-5 / 1e-4 bounds.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from voicewire.engine.config import ChunkSchedule
from voicewire.engine.model import StreamParams
from voicewire.engine.qwen3 import load_qwen3
from voicewire.engine.qwen3.presets import preset
from voicewire.engine.qwen3.testing import streaming_deviation, write_random_checkpoint
from voicewire.engine.qwen3.weights import build_modules, randomize

from .conftest import run_joining, run_stream

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _no_tf32() -> Iterator[None]:
    old = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old


def test_cuda_fp32_gives_the_cpu_codes_and_audio(tmp_path: Path) -> None:
    params = StreamParams(voice="vivian", greedy=True, forced_frames=40, seed=0)
    text = ["The GPU speaks exactly like the CPU, frame for frame."]
    # one checkpoint for both: ``randomize`` draws from a generator on the model's device, and CUDA's
    # Philox stream is not the CPU's Mersenne Twister
    write_random_checkpoint(str(tmp_path), "tiny", seed=4)
    cpu = load_qwen3(str(tmp_path), device="cpu", max_seq_len=128)
    gpu = load_qwen3(str(tmp_path), device="cuda", max_seq_len=128)
    a, b = run_stream(cpu, 0, text, params), run_stream(gpu, 0, text, params)
    np.testing.assert_array_equal(a, b)
    wa = cpu.codec.decode(torch.from_numpy(a).T[None])[0].numpy()
    wb = gpu.codec.decode(torch.from_numpy(a).T[None].cuda())[0].cpu().numpy()
    np.testing.assert_allclose(wa, wb, rtol=0, atol=1e-4)


@pytest.mark.parametrize("size", ["tiny", "0.6b"])
def test_cuda_streaming_equals_offline(size: str, record_property: pytest.RecordProperty) -> None:
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 0.05)):
        mods = build_modules(preset(size), "cuda", torch.float32, dtype)
        randomize(mods, 1)
        codec = mods.codec.eval()
        codec.prepare()
        schedules = (ChunkSchedule(), ChunkSchedule(1, (), 1), ChunkSchedule(1, (2, 4, 8, 12, 24), 48))
        err = max(streaming_deviation(codec, 130, s) for s in schedules)
        record_property(f"{size}-{dtype}-stream-vs-offline-max-abs", err)
        print(f"{size} {dtype}: streamed vs offline max abs diff {err:.3g}")
        assert err <= tol


def test_cuda_bf16_model_runs_and_stays_near_fp32(record_property: pytest.RecordProperty) -> None:
    params = StreamParams(voice="ryan", greedy=True, forced_frames=20, seed=0)
    text = ["Half precision, same weights."]
    fp32 = load_qwen3(None, "tiny", device="cuda", seed=4, max_seq_len=128)
    bf16 = load_qwen3(None, "tiny", device="cuda", dtype="bf16", seed=4, max_seq_len=128)
    a, b = run_stream(fp32, 0, text, params), run_stream(bf16, 0, text, params)
    assert b.shape == a.shape and (b >= 0).all() and (b < 2048).all()
    agree = float((a == b).all(axis=1).mean())
    wa = fp32.codec.decode(torch.from_numpy(a).T[None].cuda())[0]
    wb = bf16.codec.decode(torch.from_numpy(a).T[None].cuda())[0]
    dev = float((wa - wb).abs().max())
    record_property("bf16-frame-agreement-with-fp32", agree)
    record_property("bf16-codec-max-abs-vs-fp32", dev)
    print(f"bf16: {agree:.0%} of frames equal fp32 greedy; codec max abs deviation {dev:.3g}")
    assert dev < 0.05


def test_graph_replay_gives_the_eager_codes() -> None:
    """The captured frame step (decode + prefill buckets, padding rows) equals the same code run
    eagerly: streams joining and leaving, greedy and seeded sampling, several buckets."""
    from voicewire.engine.qwen3 import ServeOptions

    from .test_batching import STREAMS

    def run(graphs: bool) -> dict[int, np.ndarray]:
        opts = ServeOptions(max_slots=6, max_batch_size=6, max_seq_len=128, cuda_graphs=graphs)
        model = load_qwen3(None, "tiny", device="cuda", seed=4, options=opts)
        model.warmup()
        assert model.graphs.enabled == graphs
        return run_joining(model, STREAMS, 60)

    eager, graphed = run(False), run(True)
    for slot in eager:
        np.testing.assert_array_equal(graphed[slot], eager[slot], err_msg=f"slot {slot}")


def test_codec_graphs_stream_like_the_offline_decode() -> None:
    """Batched codec calls through the (batch, frames) graphs, plus one eager (ungraphed) chunk size,
    equal the offline decode of each stream."""
    from voicewire.engine.model import DecodeWork
    from voicewire.engine.qwen3 import ServeOptions

    opts = ServeOptions(max_slots=4, max_batch_size=4, max_seq_len=128, codec_graph_frames=4)
    model = load_qwen3(None, "tiny", device="cuda", seed=4, options=opts)
    model.warmup()
    codes = np.random.default_rng(0).integers(0, 2048, (3, 11, 16))
    for s in range(3):
        model.open_slot(s, StreamParams(voice="ryan", forced_frames=11))
    pieces: dict[int, list[np.ndarray]] = {s: [] for s in range(3)}
    t = 0
    for n in (1, 2, 5, 3):  # 5 > codec_graph_frames: the eager path
        work = [DecodeWork(s, [codes[s, t : t + n]], n, False) for s in range(3)]
        for s, pcm in zip(range(3), model.decode(work), strict=True):
            pieces[s].append(pcm)
        t += n
    for s in range(3):
        offline = model.codec.decode(torch.from_numpy(codes[s]).T[None].cuda())[0].cpu().numpy()
        np.testing.assert_allclose(np.concatenate(pieces[s]), offline, rtol=0, atol=1e-4)


def test_chunks_on_both_codec_lanes_stream_like_the_offline_decode() -> None:
    """A slot's chunks on the urgent lane and the bulk lane in turn (and a slot reopened for a second
    stream, its reset on the urgent lane) decode as the offline decode of each stream: the lanes
    keep each slot's calls in order."""
    from voicewire.engine.model import DecodeWork, Queued
    from voicewire.engine.qwen3 import ServeOptions

    opts = ServeOptions(max_slots=4, max_batch_size=4, max_seq_len=128, codec_graph_frames=12)
    model = load_qwen3(None, "tiny", device="cuda", seed=4, options=opts)
    model.warmup()
    runner = model.codec_runner
    assert runner.urgent_stream is not None and model.graphs.has(("codec_urgent", 4, 4))
    ran: list[object] = []
    run = model.graphs.run
    model.graphs.run = lambda key, rows, staging=None: (ran.append(key[0]), run(key, rows, staging))[1]  # type: ignore[method-assign]
    rng = np.random.default_rng(1)
    # the first stream queues all its calls before waiting (a bulk call follows urgent work still
    # running); the second, on the reopened slots, waits for each (an urgent call follows bulk ones)
    for stream in range(2):
        codes = rng.integers(0, 2048, (3, 27, 16))
        for s in range(3):
            model.open_slot(s, StreamParams(voice="ryan", forced_frames=27))
        queued = []
        t = 0
        for i, n in enumerate((1, 2, 4, 12, 4, 2, 2)):
            work = [DecodeWork(s, [codes[s, t : t + n]], n, False) for s in range(3)]
            queued.append(runner.decode_start(work, urgent=i % 2 == 0))
            if stream:
                queued[-1] = Queued.finished(queued[-1]())
            t += n
        results = [q() for q in queued]
        for s in range(3):
            offline = model.codec.decode(torch.from_numpy(codes[s]).T[None].cuda())[0].cpu().numpy()
            streamed = np.concatenate([r[s] for r in results])
            np.testing.assert_allclose(streamed, offline, rtol=0, atol=1e-4, err_msg=f"stream {stream}, slot {s}")
            model.close_slot(s)
    assert "codec_urgent" in ran and "codec" in ran


def test_overlapped_decode_and_long_chunks_give_the_serial_audio() -> None:
    """The engine with the codec on its own stream beside the frame step, and chunks growing to the
    24- and 48-frame graphs, speaks what the serial engine with the fixed cadence speaks."""
    import asyncio

    from voicewire.engine import Engine, EngineConfig
    from voicewire.engine.config import LevelConfig
    from voicewire.engine.qwen3 import ServeOptions

    opts = ServeOptions(max_slots=8, max_batch_size=8, max_seq_len=256, codec_graph_frames=48)
    model = load_qwen3(None, "tiny", device="cuda", seed=4, options=opts, warmup=True)
    assert model.decode_overlaps and model.graphs.has(("codec", 8, 48))
    lengths = (1, 7, 30, 61, 90, 130)

    async def speak(cfg: EngineConfig) -> list[np.ndarray]:
        engine = Engine(cfg, model=model).start()
        try:
            streams = []
            for i, n in enumerate(lengths):
                st = engine.open_stream(StreamParams(voice="ryan", greedy=True, forced_frames=n, seed=i))
                st.push_text("Every stream speaks the same codes in both engines.")
                st.end()
                streams.append(st)
            return [np.concatenate([c.pcm async for c in st]) for st in streams]
        finally:
            engine.close()

    flat = LevelConfig(onset_threshold_dbfs=-300.0, max_trim_ms=0.0)  # no lead-in trim: whole audio
    serial = asyncio.run(speak(EngineConfig(model="qwen3-tts", level=flat, overlap_decode=False)))
    # slack of 0 s or more: every later chunk is 24 frames, 48 once 0.5 s ahead
    grown = ChunkSchedule(slack_frames=((0.0, 24), (0.5, 48)))
    overlapped = asyncio.run(speak(EngineConfig(model="qwen3-tts", level=flat, chunks=grown)))
    for n, a, b in zip(lengths, serial, overlapped, strict=True):
        assert a.size == b.size == n * 1920
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-4, err_msg=f"{n} frames")


@pytest.mark.parametrize("cublas", [False, True], ids=["fused-linears", "norm+cublas-linears"])
def test_fused_step_matches_the_unfused_layers_in_bf16(cublas: bool) -> None:
    """The served decode path (fused Triton kernels) against the unfused layers on the same weights and
    state, 1.7B shapes in bf16: talker hidden state and codebook-0 logits within bf16 noise, and the
    code predictor's greedy codes from the same hidden state nearly all equal (bf16 near-ties may
    flip a few). Both ways of running the linears: the fused kernels (few rows), and norm + cuBLAS with
    o and down adding the residual in cuBLAS's epilogue in place (what steps past 128 rows take)."""
    from voicewire.engine.qwen3 import ExperimentalOptions, FusedSettings, ServeOptions

    fused_settings = FusedSettings(cublas_rows=0, residual_cublas_rows=0) if cublas else FusedSettings()
    opts = ServeOptions(
        max_slots=4,
        max_batch_size=4,
        max_seq_len=64,
        cuda_graphs=False,
        experimental=ExperimentalOptions(fused=fused_settings),
    )
    model = load_qwen3(None, "1.7b", device="cuda", dtype="bf16", seed=0, options=opts)
    step = model.step
    assert step.fused is not None
    slots = list(range(4))
    for s in slots:
        model.open_slot(s, StreamParams(voice="ryan", greedy=True, forced_frames=40, seed=s))
        model.add_text(s, ["Hello there, this is a check of the fused kernels."], True)
    for _ in range(4):
        model.generate(slots)
    idx = torch.tensor(slots, device="cuda")
    st = model.state
    saved = {n: t.clone() for n, t in vars(st).items() if isinstance(t, torch.Tensor)}
    kv = (model.kv.k.clone(), model.kv.v.clone())

    def restore() -> None:
        for n, t in saved.items():
            getattr(st, n).copy_(t)
        model.kv.k.copy_(kv[0])
        model.kv.v.copy_(kv[1])

    fused = step.fused
    frames, hidden_f = step.talker_step(idx)
    logits_f = fused.talker_logits(hidden_f)
    code0 = logits_f.argmax(-1)
    cp_f = fused.predict(hidden_f, code0, st, idx.to(torch.int32), frames)
    restore()
    step.fused = None
    _, hidden_u = step.talker_step(idx)
    logits_u = model.talker.logits(hidden_u)
    emb0 = model.talker.codec_embedding(code0)
    cp_u = model.code_predictor.predict(hidden_f, emb0, lambda j, lg: lg.argmax(-1))
    step.fused = fused

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.float() - b.float()).norm() / b.float().norm())

    assert rel(hidden_f, hidden_u) < 2e-2
    assert rel(logits_f, logits_u) < 2e-2
    assert float((cp_f == cp_u).float().mean()) >= 0.8, (cp_f, cp_u)
    print(
        f"bf16 fused vs unfused: hidden {rel(hidden_f, hidden_u):.2e}, logits {rel(logits_f, logits_u):.2e}"
    )


def test_fused_step_graph_replay_gives_its_eager_codes_at_real_size() -> None:
    """1.7B bf16 on the fused kernels: captured graphs give the same codes as the same body run eagerly
    (greedy and seeded sampling), and programmatic dependent launch (kernels/pdl.py) changes no code:
    two streams alone (B = 1: every linear on the one-/two-row kernel, which loads its weights before the
    PDL wait), then ten joining one batch (16-row bucket: the wide projections on norm + cuBLAS +
    SwiGLU, PDL chains broken around cuBLAS)."""
    from voicewire.engine.qwen3 import ExperimentalOptions, FusedSettings, ServeOptions

    def run(graphs: bool, pdl: bool) -> list[np.ndarray]:
        opts = ServeOptions(
            max_slots=10,
            max_batch_size=10,
            max_seq_len=64,
            cuda_graphs=graphs,
            experimental=ExperimentalOptions(fused=FusedSettings(pdl=pdl)),
        )
        model = load_qwen3(None, "1.7b", device="cuda", dtype="bf16", seed=1, options=opts)
        model.warmup()
        out = []
        for s, greedy in ((0, True), (1, False)):
            out.append(
                run_stream(model, s, ["A short one."], StreamParams(greedy=greedy, forced_frames=12, seed=9))
            )
        streams = [
            (s, s // 3, "Ten at once.", StreamParams(greedy=s % 2 == 0, forced_frames=8 + s, seed=s))
            for s in range(10)
        ]
        joined = run_joining(model, streams, steps=40)
        out.extend(joined[s] for s in range(10))
        del model
        torch.cuda.empty_cache()
        return out

    eager = run(graphs=False, pdl=False)
    for graphs, pdl in ((True, True), (True, False), (False, True)):
        for e, g in zip(eager, run(graphs, pdl), strict=True):
            np.testing.assert_array_equal(g, e, err_msg=f"graphs={graphs} pdl={pdl}")


@pytest.mark.parametrize(("size", "dtype"), [("tiny", "fp32"), ("0.6b", "bf16")])
def test_paged_cache_graphs_equal_eager_and_reused_blocks_equal_fresh(size: str, dtype: str) -> None:
    """The paged KV cache on the fused kernels: streams over 1 to 3 pages joining and leaving, captured
    graphs against the same steps run eagerly, a second wave of the same streams on the first wave's
    blocks handed out in reverse order (never cleared), and the slot-contiguous layout (one 256-position
    page per stream): all the same codes."""
    from voicewire.engine.qwen3 import ExperimentalOptions, ServeOptions

    whole = {"whole_text": True}
    streams = [
        (0, 0, "Hello world, this is a test.", StreamParams(voice="ryan", greedy=True, forced_frames=70)),
        (
            1,
            2,
            " ".join(["word"] * 70),
            StreamParams(voice="serena", greedy=True, forced_frames=60, extra=whole),
        ),
        (2, 5, "The quick brown fox.", StreamParams(voice="vivian", greedy=False, forced_frames=20, seed=7)),
        (3, 30, "Late.", StreamParams(voice="aiden", greedy=False, forced_frames=130, seed=99)),
    ]

    def run(graphs: bool, page: int = 0) -> list[dict[int, np.ndarray]]:
        opts = ServeOptions(
            max_slots=6,
            max_batch_size=6,
            max_seq_len=256,
            cuda_graphs=graphs,
            experimental=ExperimentalOptions(kv_page=page),
        )
        model = load_qwen3(None, size, device="cuda", dtype=dtype, seed=4, options=opts)
        model.warmup()
        first = run_joining(model, streams, 300)
        pool = model.kv.pool
        assert pool.free_blocks == pool.usable_blocks
        pool._free.reverse()  # the next blocks out are the ones the first wave held last
        second = run_joining(model, streams, 300)
        del model
        torch.cuda.empty_cache()
        return [first, second]

    eager = run(graphs=False)
    for name, waves in (
        ("graphs", run(graphs=True)),
        ("contiguous", run(graphs=True, page=256)),
        ("eager", eager),
    ):
        for wave, got in enumerate(waves):
            for slot, *_ in streams:
                np.testing.assert_array_equal(
                    got[slot], eager[0][slot], err_msg=f"{name} wave {wave} slot {slot}"
                )


def test_pinned_staging_is_reused_only_once_released() -> None:
    """A step's uploads share a pinned block taken back only when its owner has waited: a second
    staging meanwhile gets a block of its own, so the first's copies, queued behind a long kernel,
    still read what was put."""
    from voicewire.engine.qwen3.host_staging import PinnedBlocks, Staging

    dev, blocks = torch.device("cuda"), PinnedBlocks()
    torch.cuda._sleep(200_000_000)  # the copies below wait behind ~0.1 s of device time
    first = Staging(blocks, dev)
    a = first.put(list(range(1000)), torch.int64)
    b = first.put(np.arange(7, dtype=np.float32), torch.float32)
    into = torch.zeros(3, 5, dtype=torch.int64, device=dev)
    first.copy_into(into, np.arange(15, dtype=np.int64).reshape(3, 5))
    second = Staging(blocks, dev)
    c = second.put([-1] * 1000, torch.int64)
    torch.cuda.synchronize()
    assert a.tolist() == list(range(1000)) and b.tolist() == list(range(7))
    assert into.flatten().tolist() == list(range(15)) and c.tolist() == [-1] * 1000
    held = {blk.data_ptr() for s in (first, second) for blk in s._held}
    assert len(held) == 2  # one block each: everything of the first fitted in one
    first.release()
    second.release()
    third = Staging(blocks, dev)
    d = third.put(list(range(5)), torch.int32)
    e = third.put(np.ones(1 << 15, np.int64), torch.int64)  # 256 KiB: a larger block of its own
    torch.cuda.synchronize()
    assert d.tolist() == list(range(5)) and int(e.sum()) == 1 << 15
    assert third._held[0].data_ptr() in held and third._held[1].numel() == 1 << 18
