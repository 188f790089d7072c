"""The model time a turn may spend: a turn whose model time outgrows the audio it makes (text a model
reads slowly or not at all) would hold model capacity every other stream needs, so it is ended.
The budget is ``TextConfig.turn_budget_s`` plus ``turn_budget_per_audio_s`` per second of audio."""

from __future__ import annotations

from .config import TextConfig
from .live import Live
from .model import GenerateResult, ModelInfo
from .stream import StreamError


def charge(live: Live, res: GenerateResult, info: ModelInfo, cfg: TextConfig) -> StreamError | None:
    """One frame step's model time charged to the stream; the error that ends it when over budget."""
    live.compute_s += res.compute_s
    live.frames_generated += res.n_frames
    if live.compute_s <= cfg.turn_budget_s and cfg.turn_budget_per_audio_s >= 0:
        return None  # within the fixed budget: no need to reckon the audio's (every row, every step)
    audio_s = live.frames_generated * info.frame_samples / info.sample_rate_hz
    if live.compute_s <= cfg.turn_budget_s + cfg.turn_budget_per_audio_s * audio_s:
        return None
    return StreamError(
        "text_budget_exceeded",
        f"this turn's text took {live.compute_s:.1f} s of model time for {audio_s:.1f} s "
        "of audio; the rest of it is not spoken",
    )
