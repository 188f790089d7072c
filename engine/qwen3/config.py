"""Qwen3-TTS-12Hz configuration: frozen dataclasses parsed once from the official JSON files.

Three files describe a checkpoint (official Hugging Face layout):

- ``config.json``: the talker (with its code predictor), the speaker encoder (Base only) and the
  text/special token ids;
- ``speech_tokenizer/config.json``: the 12 Hz codec; we only need its decoder half;
- ``generation_config.json``: sampling defaults (optional; the package's hard defaults otherwise).

Keys missing from a file take the default of the official config class, so a checkpoint that the
official package loads parses here too; values we cannot serve (another activation, sliding-window
talker, the 25 Hz codec) raise :class:`CheckpointError` naming the file and key.

``preset(size)`` gives the same tree for random weights: ``"0.6b"`` and ``"1.7b"`` with the real
shapes (see shared/research/peer-baseline.md "Configs used"), and ``"tiny"`` for CPU tests.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import CheckpointError

SAMPLE_RATE_HZ = 24_000

# Codec ids shared by the released 12 Hz models (peer-baseline.md); the tiny preset reuses them so
# the prompt layout is exercised exactly as with real weights.
CODEC_LANGUAGE_IDS: dict[str, int] = {
    "english": 2050,
    "german": 2052,
    "spanish": 2054,
    "chinese": 2055,
    "japanese": 2058,
    "french": 2061,
    "korean": 2064,
    "russian": 2069,
    "italian": 2070,
}
LANGUAGE_CODES = {
    "en": "english",
    "de": "german",
    "es": "spanish",
    "zh": "chinese",
    "ja": "japanese",
    "fr": "french",
    "ko": "korean",
    "ru": "russian",
    "it": "italian",
    "pt": "portuguese",
}
SPEAKER_IDS: dict[str, int] = {"ryan": 3061, "aiden": 2861, "vivian": 3065, "serena": 3066}


@dataclass(frozen=True)
class TalkerConfig:
    """The 28-layer Qwen3 decoder that predicts codebook 0 of each frame."""

    vocab_size: int = 3072  # codec vocabulary: 2048 codes + control ids (pad/bos/eos/think/speakers/langs)
    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_layers: int = 28
    num_heads: int = 16
    num_kv_heads: int = 8
    head_dim: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    # Multimodal RoPE: frequency sections (temporal, height, width), interleaved. A TTS prompt is text
    # only, so the three position streams are equal and the rotation is the plain 1-D RoPE; kept for
    # validation and the equivalence test (rope.py).
    mrope_section: tuple[int, ...] | None = (24, 20, 20)
    mrope_interleaved: bool = True
    attention_bias: bool = False
    max_position_embeddings: int = 32768
    text_vocab_size: int = 151_936
    text_hidden_size: int = 2048
    num_code_groups: int = 16
    codec_pad_id: int = 2148
    codec_bos_id: int = 2149
    codec_eos_id: int = 2150
    codec_think_id: int = 2154
    codec_nothink_id: int = 2155
    codec_think_bos_id: int = 2156
    codec_think_eos_id: int = 2157
    languages: tuple[tuple[str, int], ...] = tuple(CODEC_LANGUAGE_IDS.items())
    speakers: tuple[tuple[str, int], ...] = tuple(SPEAKER_IDS.items())
    # speaker -> dialect language name (a key of ``languages``) or "" for none
    speaker_dialects: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise CheckpointError(
                f"talker: {self.num_heads} heads do not split into {self.num_kv_heads} KV groups"
            )
        if self.mrope_section is not None and 2 * sum(self.mrope_section) != self.head_dim:
            raise CheckpointError(
                f"talker: mrope_section {self.mrope_section} does not cover head_dim {self.head_dim}"
            )

    def language_id(self, name: str) -> int | None:
        """Codec id of a language (a config name, or its ISO 639-1 code); None for "auto" / ""."""
        key = name.lower()
        if key in ("", "auto"):
            return None
        key = LANGUAGE_CODES.get(key, key)
        for lang, idx in self.languages:
            if lang == key:
                return idx
        raise KeyError(name)

    def speaker_id(self, name: str) -> int:
        key = name.lower()
        for spk, idx in self.speakers:
            if spk == key:
                return idx
        raise KeyError(name)

    def speaker_dialect(self, name: str) -> str:
        key = name.lower()
        return next((d for s, d in self.speaker_dialects if s == key), "")

    @property
    def suppressed_ids(self) -> tuple[int, ...]:
        """Control ids the talker may never sample: the top 1024 of the vocabulary except EOS."""
        return tuple(i for i in range(self.vocab_size - 1024, self.vocab_size) if i != self.codec_eos_id)


@dataclass(frozen=True)
class CodePredictorConfig:
    """The 5-layer decoder that fills codebooks 1..15 of a frame, one sequential pass each."""

    vocab_size: int = 2048
    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_layers: int = 5
    num_heads: int = 16
    num_kv_heads: int = 8
    head_dim: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    attention_bias: bool = False
    max_position_embeddings: int = 65536
    num_code_groups: int = 16

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise CheckpointError(
                f"code predictor: {self.num_heads} heads do not split into {self.num_kv_heads} KV groups"
            )


@dataclass(frozen=True)
class CodecConfig:
    """The decoder half of the 12 Hz speech tokenizer (codes -> 24 kHz PCM)."""

    codebook_size: int = 2048
    codebook_dim: int = 512  # RVQ projections work in codebook_dim // 2
    hidden_size: int = 512  # transformer width
    latent_dim: int = 1024
    num_heads: int = 16
    num_kv_heads: int = 16
    head_dim: int = 64
    intermediate_size: int = 1024
    num_layers: int = 8
    sliding_window: int = 72  # frames each attention query sees, itself included
    rope_theta: float = 10_000.0
    rms_norm_eps: float = 1e-5
    attention_bias: bool = False
    layer_scale_initial_scale: float = 0.01
    num_quantizers: int = 16
    num_semantic_quantizers: int = 1
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    decoder_dim: int = 1536
    sample_rate_hz: int = SAMPLE_RATE_HZ

    def __post_init__(self) -> None:
        if self.decoder_dim % 2 ** len(self.upsample_rates):
            raise CheckpointError(
                f"codec: decoder_dim {self.decoder_dim} does not halve {len(self.upsample_rates)} times"
            )

    @property
    def frame_samples(self) -> int:
        """PCM samples per codec frame: 2*2*8*5*4*3 = 1920 for the released codec (80 ms at 24 kHz)."""
        return math.prod(self.upsample_rates) * math.prod(self.upsampling_ratios)


@dataclass(frozen=True)
class GenerationDefaults:
    """Sampling defaults (``generation_config.json``); the package's hard defaults when absent."""

    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    subtalker_do_sample: bool = True
    subtalker_temperature: float = 0.9
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    max_new_tokens: int = 2048
    min_new_tokens: int = 2  # the package forces this: no EOS in the first two frames


@dataclass(frozen=True)
class SpeakerEncoderConfig:
    """The Base checkpoints' ECAPA-TDNN speaker encoder: 128-bin log-mel frames -> one x-vector.

    ``enc_channels`` = the first TDNN, the SE-Res2Net blocks, then the aggregation TDNN, whose width
    is the concatenation of the SE-Res2Net outputs. ``enc_dim`` is the talker's hidden size: the
    x-vector goes straight into the codec track of the prompt.
    """

    mel_dim: int = 128
    enc_dim: int = 1024
    enc_channels: tuple[int, ...] = (512, 512, 512, 512, 1536)
    enc_kernel_sizes: tuple[int, ...] = (5, 3, 3, 3, 1)
    enc_dilations: tuple[int, ...] = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate_hz: int = SAMPLE_RATE_HZ

    def __post_init__(self) -> None:
        where = "config.json: speaker_encoder_config"
        n = len(self.enc_channels)
        if n < 3 or len(self.enc_kernel_sizes) != n or len(self.enc_dilations) != n:
            raise CheckpointError(f"{where}: enc_channels, enc_kernel_sizes, enc_dilations: same length >= 3")
        if sum(self.enc_channels[1:-1]) != self.enc_channels[-1]:
            raise CheckpointError(f"{where}: the last channel count must be the sum of the SE-Res2Net ones")
        if any(a != b for a, b in zip(self.enc_channels[:-2], self.enc_channels[1:-1], strict=True)):
            raise CheckpointError(f"{where}: the SE-Res2Net blocks are residual: equal channel counts")
        if any(c % self.enc_res2net_scale for c in self.enc_channels[1:-1]):
            raise CheckpointError(f"{where}: channels must split into enc_res2net_scale groups")


@dataclass(frozen=True)
class CodecEncoderConfig:
    """The encoder half of the 12 Hz speech tokenizer (a Mimi encoder: 24 kHz PCM -> 16 codes a frame).

    SEANet convolutions down to 25 Hz (``ratios`` 4*5*6*8 = 960 samples), a causal transformer, one
    stride-2 convolution to 12.5 Hz, then a split residual VQ (1 semantic + acoustic codebooks) of
    which the first ``valid_quantizers`` are the talker's codebooks. Defaults are Mimi's, as in the
    released speech_tokenizer/config.json ``encoder_config``.
    """

    sample_rate_hz: int = SAMPLE_RATE_HZ
    audio_channels: int = 1
    hidden_size: int = 512
    num_filters: int = 64
    num_residual_layers: int = 1
    upsampling_ratios: tuple[int, ...] = (8, 6, 5, 4)  # applied reversed by the encoder
    kernel_size: int = 7
    last_kernel_size: int = 3
    residual_kernel_size: int = 3
    dilation_growth_rate: int = 2
    pad_mode: str = "constant"
    compress: int = 2
    use_conv_shortcut: bool = False
    codebook_size: int = 2048
    codebook_dim: int = 256
    num_quantizers: int = 32
    num_semantic_quantizers: int = 1
    vector_quantization_hidden_dimension: int = 256
    num_layers: int = 8
    intermediate_size: int = 2048
    num_heads: int = 8
    num_kv_heads: int = 8
    head_dim: int = 64
    norm_eps: float = 1e-5
    rope_theta: float = 10_000.0
    layer_scale_initial_scale: float = 0.01
    attention_bias: bool = False
    frame_rate_hz: float = 12.5
    valid_quantizers: int = 16  # speech_tokenizer/config.json encoder_valid_num_quantizers

    def __post_init__(self) -> None:
        where = "speech_tokenizer/config.json: encoder_config"
        if self.pad_mode not in ("constant", "replicate", "reflect"):
            raise CheckpointError(f"{where}: pad_mode {self.pad_mode!r} is not supported")
        if self.num_heads % self.num_kv_heads:
            raise CheckpointError(
                f"{where}: {self.num_heads} heads do not split into {self.num_kv_heads} groups"
            )
        if not self.num_semantic_quantizers < self.num_quantizers:
            raise CheckpointError(f"{where}: need fewer semantic quantizers than quantizers")
        if not self.num_semantic_quantizers <= self.valid_quantizers <= self.num_quantizers:
            raise CheckpointError(
                f"{where}: encoder_valid_num_quantizers {self.valid_quantizers} out of range"
            )
        if self.downsample_stride != 2:
            raise CheckpointError(
                f"{where}: {self.sample_rate_hz} Hz / {math.prod(self.upsampling_ratios)} samples at "
                f"{self.frame_rate_hz} Hz needs a 2x downsampling (the 12 Hz tokenizer's)"
            )

    @property
    def downsample_stride(self) -> int:
        """25 Hz encoder frames per 12.5 Hz codec frame (the downsampling conv's kernel is twice this)."""
        encodec_rate = math.ceil(self.sample_rate_hz / math.prod(self.upsampling_ratios))
        return int(encodec_rate / self.frame_rate_hz)

    @property
    def frame_samples(self) -> int:
        return math.prod(self.upsampling_ratios) * 2


@dataclass(frozen=True)
class Qwen3TTSConfig:
    talker: TalkerConfig = field(default_factory=TalkerConfig)
    code_predictor: CodePredictorConfig = field(default_factory=CodePredictorConfig)
    codec: CodecConfig = field(default_factory=CodecConfig)
    generation: GenerationDefaults = field(default_factory=GenerationDefaults)
    model_type: str = "custom_voice"  # "custom_voice" | "base" | "voice_design"
    model_size: str = "0b6"  # "0b6" | "1b7" (the package drops instructions for 0b6)
    im_start_id: int = 151_644
    im_end_id: int = 151_645
    tts_pad_id: int = 151_671
    tts_bos_id: int = 151_672
    tts_eos_id: int = 151_673
    # Base checkpoints carry an ECAPA speaker encoder (voice cloning, speaker_encoder.py)
    speaker_encoder: SpeakerEncoderConfig | None = None
    # the speech tokenizer's encoder (reference codes for in-context cloning, codec_encoder.py)
    codec_encoder: CodecEncoderConfig = field(default_factory=CodecEncoderConfig)
    # ``transformers_version`` of config.json: decides the tokenizer regex quirk (tokenizer.py).
    transformers_version: str = ""

    def __post_init__(self) -> None:
        if self.model_type not in ("custom_voice", "base", "voice_design"):
            raise CheckpointError(f"config.json: unknown tts_model_type {self.model_type!r}")
        if self.code_predictor.num_code_groups != self.talker.num_code_groups:
            raise CheckpointError("config.json: talker and code predictor disagree on num_code_groups")
        if self.codec.num_quantizers != self.talker.num_code_groups:
            raise CheckpointError(
                f"speech_tokenizer/config.json: {self.codec.num_quantizers} quantizers, "
                f"but the talker makes {self.talker.num_code_groups} codebooks"
            )
        if self.code_predictor.vocab_size != self.codec.codebook_size:
            raise CheckpointError("code predictor vocabulary and codec codebook size differ")

    @property
    def voices(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.talker.speakers)

    # --- JSON <-> config -------------------------------------------------------------------------
    @classmethod
    def from_json(
        cls,
        config: Mapping[str, Any],
        speech_tokenizer: Mapping[str, Any],
        generation: Mapping[str, Any] | None = None,
    ) -> Qwen3TTSConfig:
        """Parse the three official JSON files (already loaded)."""
        tc = _get(config, "talker_config", "config.json", dict)
        cpc = _get(tc, "code_predictor_config", "config.json: talker_config", dict)
        talker = _parse_talker(tc)
        code_predictor = _parse_code_predictor(cpc)
        if speech_tokenizer.get("model_type", "qwen3_tts_tokenizer_12hz") != "qwen3_tts_tokenizer_12hz":
            raise CheckpointError(
                f"speech_tokenizer/config.json: model_type {speech_tokenizer.get('model_type')!r}; "
                "only the 12 Hz tokenizer (qwen3_tts_tokenizer_12hz) is supported"
            )
        dc = _get(speech_tokenizer, "decoder_config", "speech_tokenizer/config.json", dict)
        codec = _parse_codec(dc)
        sr = int(speech_tokenizer.get("output_sample_rate", SAMPLE_RATE_HZ))
        upsample = int(speech_tokenizer.get("decode_upsample_rate", codec.frame_samples))
        if sr != SAMPLE_RATE_HZ or upsample != codec.frame_samples:
            raise CheckpointError(
                f"speech_tokenizer/config.json: {sr} Hz / {upsample} samples per frame; "
                f"the decoder config makes {SAMPLE_RATE_HZ} Hz / {codec.frame_samples}"
            )
        tokenizer_type = config.get("tokenizer_type", "qwen3_tts_tokenizer_12hz")
        if tokenizer_type not in (None, "qwen3_tts_tokenizer_12hz"):
            raise CheckpointError(f"config.json: tokenizer_type {tokenizer_type!r} is not the 12 Hz codec")
        model_type = str(config.get("tts_model_type") or "custom_voice")
        se = config.get("speaker_encoder_config")
        if se is not None and not isinstance(se, Mapping):
            raise CheckpointError("config.json: speaker_encoder_config should be an object")
        ec = speech_tokenizer.get("encoder_config") or {}
        if not isinstance(ec, Mapping):
            raise CheckpointError("speech_tokenizer/config.json: encoder_config should be an object")
        codec_encoder = _parse_codec_encoder(
            ec, int(speech_tokenizer.get("encoder_valid_num_quantizers", codec.num_quantizers))
        )
        if codec_encoder.valid_quantizers != codec.num_quantizers:
            raise CheckpointError(
                f"speech_tokenizer/config.json: the encoder keeps {codec_encoder.valid_quantizers} "
                f"codebooks, the decoder reads {codec.num_quantizers}"
            )
        return cls(
            talker=talker,
            code_predictor=code_predictor,
            codec=codec,
            generation=_parse_generation(generation or {}),
            model_type=model_type,
            model_size=str(config.get("tts_model_size") or ""),
            im_start_id=int(config.get("im_start_token_id", 151_644)),
            im_end_id=int(config.get("im_end_token_id", 151_645)),
            tts_pad_id=int(config.get("tts_pad_token_id", 151_671)),
            tts_bos_id=int(config.get("tts_bos_token_id", 151_672)),
            tts_eos_id=int(config.get("tts_eos_token_id", 151_673)),
            # the package builds a speaker encoder for Base checkpoints only (defaults when unset)
            speaker_encoder=_parse_speaker_encoder(se or {}) if model_type == "base" else None,
            codec_encoder=codec_encoder,
            transformers_version=str(config.get("transformers_version", "")),
        )

    def to_json(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """(config.json, speech_tokenizer/config.json, generation_config.json) in the official layout."""
        t, cp, c, g = self.talker, self.code_predictor, self.codec, self.generation
        talker = {
            "vocab_size": t.vocab_size,
            "hidden_size": t.hidden_size,
            "intermediate_size": t.intermediate_size,
            "num_hidden_layers": t.num_layers,
            "num_attention_heads": t.num_heads,
            "num_key_value_heads": t.num_kv_heads,
            "head_dim": t.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": t.max_position_embeddings,
            "rms_norm_eps": t.rms_norm_eps,
            "rope_theta": t.rope_theta,
            "rope_scaling": None
            if t.mrope_section is None
            else {
                "interleaved": t.mrope_interleaved,
                "mrope_section": list(t.mrope_section),
                "rope_type": "default",
            },
            "attention_bias": t.attention_bias,
            "use_sliding_window": False,
            "num_code_groups": t.num_code_groups,
            "text_hidden_size": t.text_hidden_size,
            "text_vocab_size": t.text_vocab_size,
            "position_id_per_seconds": 13,
            "codec_eos_token_id": t.codec_eos_id,
            "codec_think_id": t.codec_think_id,
            "codec_nothink_id": t.codec_nothink_id,
            "codec_think_bos_id": t.codec_think_bos_id,
            "codec_think_eos_id": t.codec_think_eos_id,
            "codec_pad_id": t.codec_pad_id,
            "codec_bos_id": t.codec_bos_id,
            "codec_language_id": dict(t.languages),
            "spk_id": dict(t.speakers),
            "spk_is_dialect": {s: (t.speaker_dialect(s) or False) for s, _ in t.speakers},
            "code_predictor_config": {
                "vocab_size": cp.vocab_size,
                "hidden_size": cp.hidden_size,
                "intermediate_size": cp.intermediate_size,
                "num_hidden_layers": cp.num_layers,
                "num_attention_heads": cp.num_heads,
                "num_key_value_heads": cp.num_kv_heads,
                "head_dim": cp.head_dim,
                "hidden_act": "silu",
                "max_position_embeddings": cp.max_position_embeddings,
                "rms_norm_eps": cp.rms_norm_eps,
                "rope_theta": cp.rope_theta,
                "rope_scaling": None,
                "attention_bias": cp.attention_bias,
                "use_sliding_window": False,
                "num_code_groups": cp.num_code_groups,
                "layer_types": ["full_attention"] * cp.num_layers,
            },
        }
        config = {
            "architectures": ["Qwen3TTSForConditionalGeneration"],
            "model_type": "qwen3_tts",
            "talker_config": talker,
            "speaker_encoder_config": _speaker_encoder_json(self.speaker_encoder),
            "tokenizer_type": "qwen3_tts_tokenizer_12hz",
            "tts_model_size": self.model_size,
            "tts_model_type": self.model_type,
            "im_start_token_id": self.im_start_id,
            "im_end_token_id": self.im_end_id,
            "tts_pad_token_id": self.tts_pad_id,
            "tts_bos_token_id": self.tts_bos_id,
            "tts_eos_token_id": self.tts_eos_id,
        }
        if self.transformers_version:
            config["transformers_version"] = self.transformers_version
        speech = {
            "model_type": "qwen3_tts_tokenizer_12hz",
            "encoder_valid_num_quantizers": self.codec_encoder.valid_quantizers,
            "encoder_config": _codec_encoder_json(self.codec_encoder),
            "input_sample_rate": c.sample_rate_hz,
            "output_sample_rate": c.sample_rate_hz,
            "decode_upsample_rate": c.frame_samples,
            "encode_downsample_rate": c.frame_samples,
            "decoder_config": {
                "codebook_size": c.codebook_size,
                "codebook_dim": c.codebook_dim,
                "hidden_size": c.hidden_size,
                "latent_dim": c.latent_dim,
                "head_dim": c.head_dim,
                "max_position_embeddings": 8000,
                "rope_theta": c.rope_theta,
                "num_attention_heads": c.num_heads,
                "num_key_value_heads": c.num_kv_heads,
                "attention_bias": c.attention_bias,
                "sliding_window": c.sliding_window,
                "intermediate_size": c.intermediate_size,
                "hidden_act": "silu",
                "layer_scale_initial_scale": c.layer_scale_initial_scale,
                "rms_norm_eps": c.rms_norm_eps,
                "num_hidden_layers": c.num_layers,
                "num_quantizers": c.num_quantizers,
                "upsample_rates": list(c.upsample_rates),
                "upsampling_ratios": list(c.upsampling_ratios),
                "decoder_dim": c.decoder_dim,
                "attention_dropout": 0.0,
            },
        }
        generation = {
            "do_sample": g.do_sample,
            "temperature": g.temperature,
            "top_k": g.top_k,
            "top_p": g.top_p,
            "repetition_penalty": g.repetition_penalty,
            "subtalker_dosample": g.subtalker_do_sample,
            "subtalker_temperature": g.subtalker_temperature,
            "subtalker_top_k": g.subtalker_top_k,
            "subtalker_top_p": g.subtalker_top_p,
            "max_new_tokens": g.max_new_tokens,
        }
        return config, speech, generation


# --- presets (random weights) ----------------------------------------------------------------------
SIZES = ("tiny", "tiny-base", "0.6b", "1.7b")

# Small speech-tokenizer encoder and speaker encoder for the tiny presets: every structural feature
# (two SEANet stages per ratio, GQA-free attention with RoPE, the split RVQ with input projections,
# SE-Res2Net with 8-way splits) at toy widths; the real ones would dominate a tiny checkpoint.
TINY_CODEC_ENCODER = CodecEncoderConfig(
    hidden_size=16,
    num_filters=4,
    codebook_size=2048,
    codebook_dim=16,
    vector_quantization_hidden_dimension=16,
    num_quantizers=16,
    num_layers=1,
    intermediate_size=32,
    num_heads=2,
    num_kv_heads=2,
    head_dim=8,
)
TINY_SPEAKER_ENCODER = SpeakerEncoderConfig(
    enc_dim=64,
    enc_channels=(32, 32, 32, 32, 96),
    enc_attention_channels=16,
    enc_se_channels=16,
)


def preset(size: str, model_type: str = "custom_voice") -> Qwen3TTSConfig:
    """The config of a random-weight model.

    ``tiny`` keeps every structural feature of the real model (GQA, q/k norms, MRoPE sections, the
    1.7B-style ``small_to_mtp_projection``, the 72-frame codec window and the 1920-sample frame)
    at toy widths; ``tiny-base`` is a Base variant whose code predictor has the talker's width
    (no projection, like 0.6B) and carries a small speaker encoder.
    """
    if size == "0.6b":
        talker = TalkerConfig(hidden_size=1024, intermediate_size=3072)
        cfg = Qwen3TTSConfig(talker=talker, model_type=model_type, model_size="0b6")
    elif size == "1.7b":
        talker = TalkerConfig(hidden_size=2048, intermediate_size=6144)
        cfg = Qwen3TTSConfig(talker=talker, model_type=model_type, model_size="1b7")
    elif size in ("tiny", "tiny-base"):
        base = size == "tiny-base"
        talker = TalkerConfig(
            hidden_size=64,
            intermediate_size=128,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            head_dim=16,
            mrope_section=(4, 2, 2),
            text_hidden_size=32,
            # a dialect speaker exercises the package's language override (chinese/auto -> dialect)
            languages=(*CODEC_LANGUAGE_IDS.items(), ("sichuan_dialect", 2062)),
            speakers=(*SPEAKER_IDS.items(), ("eric", 3067)),
            speaker_dialects=(("eric", "sichuan_dialect"),),
        )
        cp = CodePredictorConfig(
            hidden_size=64 if base else 32,
            intermediate_size=64,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            head_dim=16,
        )
        codec = CodecConfig(
            codebook_dim=32,
            hidden_size=32,
            latent_dim=64,
            num_heads=2,
            num_kv_heads=2,
            head_dim=16,
            intermediate_size=64,
            num_layers=2,
            decoder_dim=64,
        )
        cfg = Qwen3TTSConfig(
            talker=talker,
            code_predictor=cp,
            codec=codec,
            model_type="base" if base else model_type,
            model_size="0b6",
            codec_encoder=TINY_CODEC_ENCODER,
        )
        if base:
            return dataclasses.replace(cfg, speaker_encoder=TINY_SPEAKER_ENCODER)
        return cfg
    else:
        raise ValueError(f"unknown Qwen3-TTS size {size!r}; known: {', '.join(SIZES)}")
    if model_type == "base":
        return dataclasses.replace(cfg, speaker_encoder=SpeakerEncoderConfig(enc_dim=cfg.talker.hidden_size))
    return cfg


# --- parsing helpers -------------------------------------------------------------------------------
def _get(d: Mapping[str, Any], key: str, where: str, kind: type) -> Any:
    if key not in d:
        raise CheckpointError(f"{where}: missing key {key!r}")
    v = d[key]
    if not isinstance(v, kind):
        raise CheckpointError(f"{where}: {key!r} should be a {kind.__name__}, got {type(v).__name__}")
    return v


def _check_act(d: Mapping[str, Any], where: str) -> None:
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"{where}: hidden_act {act!r} is not supported (silu only)")


def _parse_talker(tc: Mapping[str, Any]) -> TalkerConfig:
    where = "config.json: talker_config"
    _check_act(tc, where)
    if tc.get("use_sliding_window"):
        raise CheckpointError(f"{where}: a sliding-window talker is not supported")
    hidden = int(tc.get("hidden_size", 1024))
    heads = int(tc.get("num_attention_heads", 16))
    rs = tc.get("rope_scaling")
    section = (
        tuple(int(x) for x in rs["mrope_section"])
        if isinstance(rs, Mapping) and "mrope_section" in rs
        else None
    )
    interleaved = bool(rs.get("interleaved", False)) if isinstance(rs, Mapping) else False
    if isinstance(rs, Mapping) and rs.get("rope_type", rs.get("type", "default")) != "default":
        raise CheckpointError(f"{where}: rope_type {rs.get('rope_type')!r} is not supported")
    langs = tc.get("codec_language_id") or {}
    spks = tc.get("spk_id") or {}
    dialects = tc.get("spk_is_dialect") or {}
    return TalkerConfig(
        vocab_size=int(tc.get("vocab_size", 3072)),
        hidden_size=hidden,
        intermediate_size=int(tc.get("intermediate_size", 2048)),
        num_layers=int(tc.get("num_hidden_layers", 20)),
        num_heads=heads,
        num_kv_heads=int(tc.get("num_key_value_heads", 2)),
        head_dim=int(tc.get("head_dim") or hidden // heads),
        rms_norm_eps=float(tc.get("rms_norm_eps", 1e-6)),
        rope_theta=float(tc.get("rope_theta", 10000.0)),
        mrope_section=section,
        mrope_interleaved=interleaved,
        attention_bias=bool(tc.get("attention_bias", False)),
        max_position_embeddings=int(tc.get("max_position_embeddings", 32768)),
        text_vocab_size=int(_get(tc, "text_vocab_size", where, int)),
        text_hidden_size=int(tc.get("text_hidden_size", 2048)),
        num_code_groups=int(tc.get("num_code_groups", 32)),
        codec_pad_id=int(tc.get("codec_pad_id", 4196)),
        codec_bos_id=int(tc.get("codec_bos_id", 4197)),
        codec_eos_id=int(tc.get("codec_eos_token_id", 4198)),
        codec_think_id=int(tc.get("codec_think_id", 4202)),
        codec_nothink_id=int(tc.get("codec_nothink_id", 4203)),
        codec_think_bos_id=int(tc.get("codec_think_bos_id", 4204)),
        codec_think_eos_id=int(tc.get("codec_think_eos_id", 4205)),
        languages=tuple((str(k).lower(), int(v)) for k, v in langs.items()),
        speakers=tuple((str(k).lower(), int(v)) for k, v in spks.items()),
        speaker_dialects=tuple((str(k).lower(), str(v).lower()) for k, v in dialects.items() if v),
    )


def _parse_code_predictor(c: Mapping[str, Any]) -> CodePredictorConfig:
    where = "config.json: code_predictor_config"
    _check_act(c, where)
    if c.get("use_sliding_window"):
        raise CheckpointError(f"{where}: a sliding-window code predictor is not supported")
    hidden = int(c.get("hidden_size", 1024))
    heads = int(c.get("num_attention_heads", 16))
    return CodePredictorConfig(
        vocab_size=int(c.get("vocab_size", 2048)),
        hidden_size=hidden,
        intermediate_size=int(c.get("intermediate_size", 3072)),
        num_layers=int(c.get("num_hidden_layers", 5)),
        num_heads=heads,
        num_kv_heads=int(c.get("num_key_value_heads", 8)),
        head_dim=int(c.get("head_dim") or hidden // heads),
        rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
        rope_theta=float(c.get("rope_theta", 10000.0)),
        attention_bias=bool(c.get("attention_bias", False)),
        max_position_embeddings=int(c.get("max_position_embeddings", 32768)),
        num_code_groups=int(c.get("num_code_groups", 32)),
    )


def _parse_codec(d: Mapping[str, Any]) -> CodecConfig:
    where = "speech_tokenizer/config.json: decoder_config"
    _check_act(d, where)
    hidden = int(d.get("hidden_size", 1024))
    heads = int(d.get("num_attention_heads", 16))
    return CodecConfig(
        codebook_size=int(d.get("codebook_size", 2048)),
        codebook_dim=int(_get(d, "codebook_dim", where, int)),
        hidden_size=hidden,
        latent_dim=int(d.get("latent_dim", 1024)),
        num_heads=heads,
        num_kv_heads=int(d.get("num_key_value_heads", 16)),
        head_dim=int(d.get("head_dim") or hidden // heads),
        intermediate_size=int(d.get("intermediate_size", 3072)),
        num_layers=int(d.get("num_hidden_layers", 8)),
        sliding_window=int(d.get("sliding_window", 72)),
        rope_theta=float(d.get("rope_theta", 10000.0)),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-5)),
        attention_bias=bool(d.get("attention_bias", False)),
        layer_scale_initial_scale=float(d.get("layer_scale_initial_scale", 0.01)),
        num_quantizers=int(d.get("num_quantizers", 16)),
        upsample_rates=tuple(int(x) for x in d.get("upsample_rates", (8, 5, 4, 3))),
        upsampling_ratios=tuple(int(x) for x in d.get("upsampling_ratios", (2, 2))),
        decoder_dim=int(d.get("decoder_dim", 1536)),
    )


def _parse_generation(g: Mapping[str, Any]) -> GenerationDefaults:
    d = GenerationDefaults()
    return GenerationDefaults(
        do_sample=bool(g.get("do_sample", d.do_sample)),
        temperature=float(g.get("temperature", d.temperature)),
        top_k=int(g.get("top_k", d.top_k)),
        top_p=float(g.get("top_p", d.top_p)),
        repetition_penalty=float(g.get("repetition_penalty", d.repetition_penalty)),
        subtalker_do_sample=bool(g.get("subtalker_dosample", d.subtalker_do_sample)),
        subtalker_temperature=float(g.get("subtalker_temperature", d.subtalker_temperature)),
        subtalker_top_k=int(g.get("subtalker_top_k", d.subtalker_top_k)),
        subtalker_top_p=float(g.get("subtalker_top_p", d.subtalker_top_p)),
        max_new_tokens=int(g.get("max_new_tokens", d.max_new_tokens)),
    )


def _parse_speaker_encoder(d: Mapping[str, Any]) -> SpeakerEncoderConfig:
    c = SpeakerEncoderConfig()
    return SpeakerEncoderConfig(
        mel_dim=int(d.get("mel_dim", c.mel_dim)),
        enc_dim=int(d.get("enc_dim", c.enc_dim)),
        enc_channels=tuple(int(x) for x in d.get("enc_channels", c.enc_channels)),
        enc_kernel_sizes=tuple(int(x) for x in d.get("enc_kernel_sizes", c.enc_kernel_sizes)),
        enc_dilations=tuple(int(x) for x in d.get("enc_dilations", c.enc_dilations)),
        enc_attention_channels=int(d.get("enc_attention_channels", c.enc_attention_channels)),
        enc_res2net_scale=int(d.get("enc_res2net_scale", c.enc_res2net_scale)),
        enc_se_channels=int(d.get("enc_se_channels", c.enc_se_channels)),
        sample_rate_hz=int(d.get("sample_rate", c.sample_rate_hz)),
    )


def _speaker_encoder_json(c: SpeakerEncoderConfig | None) -> dict[str, Any]:
    if c is None:
        return {}
    return {
        "mel_dim": c.mel_dim,
        "enc_dim": c.enc_dim,
        "enc_channels": list(c.enc_channels),
        "enc_kernel_sizes": list(c.enc_kernel_sizes),
        "enc_dilations": list(c.enc_dilations),
        "enc_attention_channels": c.enc_attention_channels,
        "enc_res2net_scale": c.enc_res2net_scale,
        "enc_se_channels": c.enc_se_channels,
        "sample_rate": c.sample_rate_hz,
    }


# CodecEncoderConfig field -> MimiConfig key, where they differ
_MIMI_KEYS = {
    "sample_rate_hz": "sampling_rate",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "frame_rate_hz": "frame_rate",
}


def _parse_codec_encoder(d: Mapping[str, Any], valid_quantizers: int) -> CodecEncoderConfig:
    where = "speech_tokenizer/config.json: encoder_config"
    if d.get("hidden_act", "gelu") != "gelu":
        raise CheckpointError(f"{where}: hidden_act {d.get('hidden_act')!r} is not supported (gelu only)")
    if not d.get("use_causal_conv", True):
        raise CheckpointError(f"{where}: a non-causal encoder is not supported")
    c = CodecEncoderConfig()
    values: dict[str, Any] = {}
    for f in dataclasses.fields(CodecEncoderConfig):
        key = _MIMI_KEYS.get(f.name, f.name)
        if f.name == "valid_quantizers" or key not in d or d[key] is None:
            continue
        default = getattr(c, f.name)
        values[f.name] = (
            tuple(int(x) for x in d[key]) if isinstance(default, tuple) else type(default)(d[key])
        )
    ratios = values.get("upsampling_ratios", c.upsampling_ratios)
    values.setdefault(
        "frame_rate_hz", values.get("sample_rate_hz", c.sample_rate_hz) / (math.prod(ratios) * 2)
    )
    if "codebook_dim" in d and d["codebook_dim"] is None:  # Mimi: null means the encoder width
        values["codebook_dim"] = values.get("hidden_size", c.hidden_size)
    if "head_dim" not in values:
        values["head_dim"] = values.get("hidden_size", c.hidden_size) // values.get("num_heads", c.num_heads)
    return CodecEncoderConfig(**values, valid_quantizers=valid_quantizers)


def _codec_encoder_json(c: CodecEncoderConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(CodecEncoderConfig):
        if f.name == "valid_quantizers":
            continue
        v = getattr(c, f.name)
        out[_MIMI_KEYS.get(f.name, f.name)] = list(v) if isinstance(v, tuple) else v
    # upsample_groups: the Mimi decoder's upsampling (unused by this encoder) must split the width;
    # the released codec has it equal to the width
    return {**out, "hidden_act": "gelu", "use_causal_conv": True, "upsample_groups": c.hidden_size}
