"""Phone-call audio: G.711 (mu-law and A-law) at 8000 Hz, what Twilio media streams and SIP trunks
carry. The names clients use for it differ by vendor; ``protocol.G711_ALIASES`` maps them to ours.

    ours    ElevenLabs   Cartesia    Twilio / MIME
    mulaw   ulaw_8000    pcm_mulaw   audio/x-mulaw (audio/basic, RFC 2046)
    alaw    alaw_8000    pcm_alaw    audio/x-alaw

(OpenAI's speech API has no telephony format.) The encoding is one byte per sample, no header.
"""

from __future__ import annotations

import functools
from typing import cast

import av
import numpy as np

from .protocol import G711_RATE_HZ

G711_FRAME_MS = 20  # one WebSocket message: 160 samples = 160 bytes, the size of Twilio's media messages
G711_FRAME_SAMPLES = G711_RATE_HZ * G711_FRAME_MS // 1000
_CODECS = {"mulaw": "pcm_mulaw", "alaw": "pcm_alaw"}


@functools.cache
def _table(law: str) -> np.ndarray:
    """G.711 byte of every int16 value (65,536 entries), from FFmpeg's own encoder: one table
    lookup per sample afterwards, and the bytes are FFmpeg's exactly."""
    ctx = cast(av.AudioCodecContext, av.CodecContext.create(_CODECS[law], "w"))
    ctx.sample_rate = G711_RATE_HZ
    ctx.layout = "mono"
    ctx.format = "s16"
    ctx.open()
    every = np.arange(-32768, 32768, dtype="<i2").reshape(1, -1)
    frame = av.AudioFrame.from_ndarray(every, format="s16", layout="mono")
    frame.sample_rate = G711_RATE_HZ
    packets = [*ctx.encode(frame), *ctx.encode(None)]  # type: ignore[attr-defined]
    table = np.frombuffer(b"".join(bytes(p) for p in packets), np.uint8)
    if table.size != every.size:
        raise RuntimeError(f"{_CODECS[law]} gave {table.size} bytes for {every.size} samples")
    return table


class G711Codec:
    """int16 samples at 8000 Hz -> G.711 bytes (``law``: "mulaw" or "alaw")."""

    def __init__(self, law: str) -> None:
        self._table = _table(law)

    def encode(self, samples: np.ndarray) -> bytes:
        return self._table[samples.astype(np.int32) + 32768].tobytes()
