"""The official checkpoint JSON files <-> our config tree (config.py).

``config_from_json`` parses ``config.json``, ``speech_tokenizer/config.json`` and
``generation_config.json`` (already loaded); ``config_to_json`` writes the same three in the
official layout (random-weight checkpoints for the parity tests and the side-by-side benchmark).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from .config import (
    SAMPLE_RATE_HZ,
    CodecConfig,
    CodecEncoderConfig,
    CodePredictorConfig,
    GenerationDefaults,
    Qwen3TTSConfig,
    SpeakerEncoderConfig,
    TalkerConfig,
)
from .errors import CheckpointError


def config_from_json(
    config: Mapping[str, Any],
    speech_tokenizer: Mapping[str, Any],
    generation: Mapping[str, Any] | None = None,
) -> Qwen3TTSConfig:
    """Parse the three official JSON files (already loaded).

    Keys missing from a file take the default of the official config class, so a checkpoint that
    the official package loads parses here too; values we cannot serve (another activation, a
    sliding-window talker, the 25 Hz codec) raise :class:`CheckpointError` naming the file and key.
    """
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
    return Qwen3TTSConfig(
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

def config_to_json(cfg: Qwen3TTSConfig) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(config.json, speech_tokenizer/config.json, generation_config.json) in the official layout."""
    t, cp, c, g = cfg.talker, cfg.code_predictor, cfg.codec, cfg.generation
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
        "speaker_encoder_config": _speaker_encoder_json(cfg.speaker_encoder),
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_size": cfg.model_size,
        "tts_model_type": cfg.model_type,
        "im_start_token_id": cfg.im_start_id,
        "im_end_token_id": cfg.im_end_id,
        "tts_pad_token_id": cfg.tts_pad_id,
        "tts_bos_token_id": cfg.tts_bos_id,
        "tts_eos_token_id": cfg.tts_eos_id,
    }
    if cfg.transformers_version:
        config["transformers_version"] = cfg.transformers_version
    speech = {
        "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_valid_num_quantizers": cfg.codec_encoder.valid_quantizers,
        "encoder_config": _codec_encoder_json(cfg.codec_encoder),
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
