"""Audio level helpers: onset detection, lead-in trimming, gain with a soft limiter."""

from __future__ import annotations

import numpy as np

ONSET_WINDOW_MS = 10.0  # the audible-TTFA convention: first 10 ms window above the threshold
# A 10 ms window louder than this is audible: the one onset level of the server's TTFA, the lead-in
# trimmer, barge-in truncation and every client-side measurement, so their figures compare.
ONSET_THRESHOLD_DBFS = -45.0


def dbfs(pcm: np.ndarray) -> float:
    """RMS level of float PCM in dBFS (-inf for silence)."""
    if pcm.size == 0:
        return float("-inf")
    rms = float(np.sqrt(np.mean(np.square(pcm, dtype=np.float64))))
    return 20.0 * np.log10(rms) if rms > 0 else float("-inf")


def first_audible_sample(pcm: np.ndarray, sample_rate_hz: int, threshold_dbfs: float) -> int | None:
    """Start of the first 10 ms window whose RMS is above ``threshold_dbfs``; None if none is."""
    win = max(1, int(sample_rate_hz * ONSET_WINDOW_MS / 1000))
    n = pcm.size // win
    if n == 0:
        return None
    power = np.mean(np.square(pcm[: n * win].reshape(n, win), dtype=np.float64), axis=1)
    loud = np.flatnonzero(power > 10.0 ** (threshold_dbfs / 10.0))
    return int(loud[0]) * win if loud.size else None


class LeadInTrimmer:
    """Drops the near-silence a model puts before the first sound of a turn.

    The embedded voice starts every utterance with 200-300 ms below -45 dBFS: every audible-TTFA
    figure would carry it. Chunks are held back (not emitted) while they are silent, up to
    ``max_trim_ms``; the first audible chunk is emitted from ``preroll_ms`` before its onset.
    """

    def __init__(self, sample_rate_hz: int, threshold_dbfs: float, preroll_ms: float, max_trim_ms: float):
        self._rate = sample_rate_hz
        self._threshold = threshold_dbfs
        self._preroll = int(sample_rate_hz * preroll_ms / 1000)
        self._max_trim = int(sample_rate_hz * max_trim_ms / 1000)
        self._held = np.zeros(0, np.float32)
        self._trimmed = 0
        self.done = False

    @property
    def trimmed_samples(self) -> int:
        return self._trimmed

    def push(self, pcm: np.ndarray, final: bool) -> np.ndarray:
        """PCM to emit now (possibly empty) for this chunk."""
        if self.done:
            return pcm
        held = np.concatenate([self._held, pcm]) if self._held.size else pcm
        onset = first_audible_sample(held, self._rate, self._threshold)
        if onset is None and not final and held.size < self._max_trim:
            self._held = held
            return np.zeros(0, np.float32)
        cut = max(0, (onset if onset is not None else held.size) - self._preroll)
        if onset is None:
            cut = 0  # gave up waiting (too long or final): emit all, it may be a quiet voice
        self._trimmed = cut
        self._held = np.zeros(0, np.float32)
        self.done = True
        return held[cut:]


def apply_gain(pcm: np.ndarray, gain_db: float, knee: float = 0.8) -> np.ndarray:
    """Fixed gain, then a soft limiter above ``knee`` so peaks never clip hard."""
    y = pcm * np.float32(10.0 ** (gain_db / 20.0))
    over = np.abs(y) > knee
    if np.any(over):
        head = 1.0 - knee
        y[over] = np.sign(y[over]) * (knee + head * np.tanh((np.abs(y[over]) - knee) / head))
    return y.astype(np.float32, copy=False)
