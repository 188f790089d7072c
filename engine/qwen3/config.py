"""Qwen3-TTS-12Hz configuration: a tree of frozen dataclasses, validated once at construction.

Three files describe a checkpoint (official Hugging Face layout): ``config.json`` (the talker with
its code predictor, the speaker encoder of Base checkpoints, the text/special token ids),
``speech_tokenizer/config.json`` (the 12 Hz codec) and ``generation_config.json`` (sampling
defaults). ``hf_config.py`` converts between those files and this tree; ``presets.py`` gives the
same tree for random weights. Values we cannot serve raise :class:`CheckpointError`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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
