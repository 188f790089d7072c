"""Voice cloning for Base checkpoints: reference audio -> a ``VoiceProfile`` of derived artifacts.

    pcm (S,) at any rate -> 24 kHz mono (soxr, the resampler the package's librosa uses)
      -> speaker encoder -> x-vector (H,)                   both modes
      -> speech-tokenizer encoder -> reference codes (F, 16)  in-context mode, with the transcript

Two modes, as the official package offers them:

- x-vector only (``ref_text`` empty): the x-vector takes the speaker position of the prompt;
- in-context (``ref_text`` given): the x-vector as well, and the reference transcript + frames
  before the text, so the talker continues the reference (prompt.py ``build_icl_prompt``).

A profile is computed once per reference and reused by every stream that speaks with it: pass it
to a slot as ``StreamParams.extra["voice_profile"]``, as a ``VoiceProfile`` or as the engine's
torch-free ``ClonedVoice`` (``to_cloned`` / ``from_cloned``: what the voices API persists and what
crosses to an engine core). Deriving one is not part of the frame step (100-300 ms for a few
seconds of audio on the real encoders), and a profile is small (an (H,) vector and F x 16 codes).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..cloned_voice import CLONED_VOICE_KEY, ClonedVoice
from .codec_encoder import CodecEncoder
from .config import Qwen3TTSConfig
from .errors import CheckpointError
from .speaker_encoder import SpeakerEncoder
from .weights import load_codec_encoder, load_speaker_encoder, read_config

PROFILE_KEY = CLONED_VOICE_KEY  # the StreamParams.extra key a slot reads its cloned voice from
MIN_SAMPLES = 2 * 1024  # the mel front end needs a few frames (and its reflect padding, > 384 samples)


@dataclass(frozen=True)
class VoiceProfile:
    """What a cloned voice is made of; tensors on the CPU, independent of any slot or device."""

    speaker_embedding: Tensor  # (H,) float32 x-vector, H = the talker's hidden size
    ref_codes: Tensor | None = None  # (F, 16) int64 reference frames: in-context mode
    ref_text: str = ""  # the reference transcript (in-context mode)

    def __post_init__(self) -> None:
        if self.speaker_embedding.dim() != 1:
            raise ValueError(f"speaker_embedding must be (H,), got {tuple(self.speaker_embedding.shape)}")
        if (self.ref_codes is None) != (not self.ref_text):
            raise ValueError("in-context cloning needs both ref_codes and ref_text; x-vector mode neither")
        if self.ref_codes is not None and (self.ref_codes.dim() != 2 or self.ref_codes.shape[0] == 0):
            raise ValueError(f"ref_codes must be (F >= 1, 16), got {tuple(self.ref_codes.shape)}")

    @property
    def in_context(self) -> bool:
        return self.ref_codes is not None

    def to_cloned(self, encoder: str) -> ClonedVoice:
        arrays = {"speaker_embedding": self.speaker_embedding.float().numpy()}
        if self.ref_codes is not None:
            arrays["ref_codes"] = self.ref_codes.numpy().astype(np.int32)  # codes < 2048: half the bytes
        return ClonedVoice(encoder, arrays, self.ref_text)

    @classmethod
    def from_cloned(cls, voice: ClonedVoice) -> VoiceProfile:
        """ValueError for arrays that are not a profile's."""
        a = voice.arrays
        if "speaker_embedding" not in a or set(a) - {"speaker_embedding", "ref_codes"}:
            raise ValueError(f"not a Qwen3-TTS voice profile: arrays {sorted(a)}")
        codes = a.get("ref_codes")
        return cls(
            torch.from_numpy(np.array(a["speaker_embedding"], np.float32)),
            None if codes is None else torch.from_numpy(np.array(codes, np.int64)),
            voice.ref_text,
        )


def resample_mono(pcm: np.ndarray, sample_rate_hz: int, target_hz: int) -> np.ndarray:
    """Mono float32 at ``target_hz``: channels (last axis) averaged, resampled as librosa.resample's
    default does (soxr "HQ", length fixed to ceil(S * ratio)), so both sides see the same samples."""
    x = np.asarray(pcm, dtype=np.float32)
    if x.ndim > 1:
        x = x.mean(axis=-1)
    if sample_rate_hz == target_hz:
        return x
    import soxr  # only when a reference arrives at another rate

    out = soxr.resample(x, sample_rate_hz, target_hz, quality="soxr_hq").astype(np.float32)
    n = int(np.ceil(x.shape[-1] * target_hz / sample_rate_hz))
    return out[:n] if out.shape[-1] >= n else np.pad(out, (0, n - out.shape[-1]))


class VoiceCloner:
    def __init__(
        self,
        cfg: Qwen3TTSConfig,
        speaker_encoder: SpeakerEncoder,
        codec_encoder: CodecEncoder,
        encoder_id: str = "qwen3-tts-base",
    ) -> None:
        self.cfg, self.speaker_encoder, self.codec_encoder = cfg, speaker_encoder, codec_encoder
        # names these weights (ModelInfo.voice_encoder): a profile fits only the encoder that made it
        self.encoder_id = encoder_id
        if speaker_encoder.cfg.enc_dim != cfg.talker.hidden_size:
            raise CheckpointError(
                f"speaker encoder makes {speaker_encoder.cfg.enc_dim}-wide x-vectors, "
                f"the talker is {cfg.talker.hidden_size} wide"
            )

    @classmethod
    def from_checkpoint(
        cls,
        directory: str,
        speaker_tensors: dict[str, Tensor],
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> VoiceCloner:
        """Both encoders of a Base checkpoint; ``speaker_tensors``: what the serving load kept aside
        (``Qwen3TTSModel.speaker_encoder_weights``)."""
        cfg = read_config(directory)
        spk = load_speaker_encoder(cfg, speaker_tensors, device, dtype)
        digest = hashlib.sha256()
        for name in sorted(speaker_tensors):  # a few MB: the x-vectors depend on nothing else
            digest.update(name.encode())
            digest.update(speaker_tensors[name].detach().float().cpu().numpy().tobytes())
        encoder_id = f"qwen3-tts-base/{digest.hexdigest()[:16]}"
        return cls(cfg, spk, load_codec_encoder(cfg, directory, device, dtype), encoder_id)

    @classmethod
    def random(
        cls,
        cfg: Qwen3TTSConfig,
        seed: int = 0,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> VoiceCloner:
        """Random encoders for a random-weight Base model (``load_qwen3(None, "tiny-base")``): every
        path live, x-vectors of about 0.5 rms, codes spread over the codebooks."""
        if cfg.speaker_encoder is None:
            raise CheckpointError(f"a {cfg.model_type} model has no speaker encoder (Base only)")
        gen = torch.Generator().manual_seed(seed)
        spk, enc = SpeakerEncoder(cfg.speaker_encoder), CodecEncoder(cfg.codec_encoder)
        with torch.no_grad():
            for module in (spk, enc):
                for name, p in module.named_parameters():
                    p.copy_(_random_like(name, p, gen))
        return cls(
            cfg,
            spk.to(device=device, dtype=dtype).eval().requires_grad_(False),
            enc.to(device=device, dtype=dtype).eval().requires_grad_(False),
            f"qwen3-tts-base/random-h{cfg.talker.hidden_size}-seed{seed}",
        )

    @torch.no_grad()
    def profile(self, pcm: np.ndarray, sample_rate_hz: int, ref_text: str = "") -> VoiceProfile:
        """A reference clip (S,) or (S, C) at ``sample_rate_hz`` -> its profile; in-context mode when
        ``ref_text`` (the clip's transcript) is given, x-vector only otherwise."""
        spk_rate = self.speaker_encoder.cfg.sample_rate_hz
        x = resample_mono(pcm, sample_rate_hz, spk_rate)
        if x.shape[-1] < MIN_SAMPLES:
            raise ValueError(f"reference audio too short: {x.shape[-1]} samples at {spk_rate} Hz")
        embedding = self.speaker_encoder.embed(torch.from_numpy(x)).float().cpu()
        if not ref_text:
            return VoiceProfile(embedding)
        codec_rate = self.codec_encoder.cfg.sample_rate_hz
        y = x if codec_rate == spk_rate else resample_mono(pcm, sample_rate_hz, codec_rate)
        codes = self.codec_encoder.encode(torch.from_numpy(y)).cpu()
        return VoiceProfile(embedding, codes, ref_text)


def _random_like(name: str, p: Tensor, gen: torch.Generator) -> Tensor:
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "embed_sum":
        return torch.randn(p.shape, generator=gen)
    if leaf == "cluster_usage":
        return torch.rand(p.shape, generator=gen) * 1.5 + 0.5
    if leaf == "scale":  # layer scales large enough that the transformer reaches the codes
        return torch.rand(p.shape, generator=gen) * 0.4 + 0.2
    if leaf == "bias":
        return torch.randn(p.shape, generator=gen) * 0.02
    if p.dim() == 1:  # layer norms
        return 1.0 + torch.randn(p.shape, generator=gen) * 0.05
    fan_in = math.prod(p.shape[1:])
    # He-scaled (ReLU / ELU stay O(1)); the x-vector's last 1x1 conv scaled down to ~0.5 rms
    gain = 0.02 if name == "fc.weight" else 2.0**0.5
    return torch.randn(p.shape, generator=gen) * gain * fan_in**-0.5
