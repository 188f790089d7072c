"""Configs for random weights: ``preset(size)``.

``"0.6b"`` and ``"1.7b"`` have the real shapes (see shared/research/peer-baseline.md "Configs used"),
``"tiny"`` and ``"tiny-base"`` every structural feature at toy widths, for CPU tests.
"""

from __future__ import annotations

import dataclasses

from .config import (
    CODEC_LANGUAGE_IDS,
    SPEAKER_IDS,
    CodecConfig,
    CodecEncoderConfig,
    CodePredictorConfig,
    Qwen3TTSConfig,
    SpeakerEncoderConfig,
    TalkerConfig,
)

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
