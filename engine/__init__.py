"""voicewire engine: streaming TTS behind one async API.

    engine = Engine(EngineConfig(model="hibari")).start()
    stream = engine.open_stream()            # on a running asyncio loop
    stream.push_text("Hello, "); stream.push_text("world."); stream.end()
    async for chunk in stream: ...           # AudioChunk: float32 PCM, 24 kHz, offsets, final marker

Imports nothing from realtime/ and no transport package (aiohttp, aiortc, av, websockets).
"""

from .cloned_voice import CLONED_VOICE_KEY, ClonedVoice, CloningNotSupported
from .config import ChunkSchedule, EngineConfig, LevelConfig, TextConfig
from .engine import Engine, EngineBusy, EngineNotReady
from .level import ONSET_THRESHOLD_DBFS, dbfs, first_audible_sample
from .model import GenerateResult, Model, ModelError, ModelInfo, StreamParams, TextGranularity
from .models import MODEL_NAMES, load_model
from .playout import Playout
from .stats import EngineStats
from .stream import AudioChunk, Stream, StreamError, StreamMetrics
from .word_timing import WordTiming

__all__ = [
    "CLONED_VOICE_KEY",
    "MODEL_NAMES",
    "ONSET_THRESHOLD_DBFS",
    "AudioChunk",
    "ChunkSchedule",
    "ClonedVoice",
    "CloningNotSupported",
    "Engine",
    "EngineBusy",
    "EngineConfig",
    "EngineNotReady",
    "EngineStats",
    "GenerateResult",
    "LevelConfig",
    "Model",
    "ModelError",
    "ModelInfo",
    "Playout",
    "Stream",
    "StreamError",
    "StreamMetrics",
    "StreamParams",
    "TextConfig",
    "TextGranularity",
    "WordTiming",
    "dbfs",
    "first_audible_sample",
    "load_model",
]
