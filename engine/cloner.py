"""Voice cloning beside the worker: the model's encoders run on a thread of their own, made at the
first clone, one clone at a time, so the worker keeps stepping every stream meanwhile."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .cloned_voice import ClonedVoice, CloningNotSupported
from .model import Model


class Cloner:
    def __init__(self) -> None:
        self._thread: ThreadPoolExecutor | None = None

    async def clone(self, model: Model, pcm: np.ndarray, sample_rate_hz: int, ref_text: str) -> ClonedVoice:
        """``Model.clone_voice`` on the clone thread. Raises CloningNotSupported, or ValueError for
        audio the model cannot use."""
        if not model.info.voice_encoder:
            raise CloningNotSupported(f"{model.info.name} cannot clone voices")
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="voicewire-clone")
        return await asyncio.get_running_loop().run_in_executor(
            self._thread, model.clone_voice, np.asarray(pcm, np.float32), sample_rate_hz, ref_text
        )

    def close(self) -> None:
        """Waits for a clone under way, then ends the thread (a later clone makes a new one)."""
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None
