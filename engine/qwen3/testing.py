"""Test fixtures in the official checkpoint layout: tokenizer files and random checkpoints.

Real weights cannot be downloaded here, so parity with the official package runs on random weights
written in the official layout. The tokenizer is a real byte-level BPE of the Qwen2 kind, padded to
Qwen2's 151,643 ordinary tokens so the special tokens sit at their real ids (<|im_start|> = 151,644,
tts_pad = 151,671, ...) and the official loader treats it as it treats the real vocabulary (it
rewrites the split regex of > 100k-token vocabularies, see tokenizer.py). Its merges make the chat
markers single tokens ("assistant", "\\n") as in Qwen2, and split English into a few pieces a word.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import torch
from tokenizers import pre_tokenizers

from ..config import ChunkSchedule
from .codec_decoder import CodecDecoder
from .config import Qwen3TTSConfig
from .hf_config import config_to_json
from .presets import preset
from .weights import build_modules, randomize, save_checkpoint

QWEN2_ORDINARY_TOKENS = 151_643
QWEN2_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",  # 151671
    "<tts_text_bos>",  # 151672
    "<tts_text_eod>",  # 151673
    "<tts_text_bos_single>",
)
# words built up by prefix merges; "assistant" first so the chat marker is always one token
_WORDS = (
    "assistant",
    "user",
    " the",
    " quick",
    " brown",
    " fox",
    " hello",
    "Hello",
    " world",
    " this",
    " is",
    " test",
    " morning",
    " good",
    "Good",
    "The",
    " over",
    " lazy",
    " dog",
    " and",
    "ing",
    "er",
    "ed",
    " a",
    " to",
    " of",
    " in",
    " it",
    "'s",
)
# A small corpus-free merge list is enough: anything not covered falls back to bytes.


def write_tokenizer_files(directory: str) -> None:
    """vocab.json, merges.txt and tokenizer_config.json of a Qwen2-shaped byte-level BPE."""
    to_byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab: dict[str, int] = {ch: i for i, ch in enumerate(alphabet)}
    merges: list[tuple[str, str]] = []
    for word in _WORDS:
        symbols = "".join(piece for piece, _ in to_byte_level.pre_tokenize_str(word))
        for i in range(2, len(symbols) + 1):
            left, right = symbols[: i - 1], symbols[i - 1]
            if symbols[:i] not in vocab:
                merges.append((left, right))
                vocab[symbols[:i]] = len(vocab)
    filler = 0
    while len(vocab) < QWEN2_ORDINARY_TOKENS:
        vocab[f"<|vw_filler_{filler}|>"] = len(vocab)
        filler += 1
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(directory, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        f.writelines(f"{a} {b}\n" for a, b in merges)
    added = {
        str(QWEN2_ORDINARY_TOKENS + i): {
            "content": tok,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, tok in enumerate(QWEN2_SPECIAL_TOKENS)
    }
    config = {
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 32768,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)


SPEECH_PREPROCESSOR = {
    "feature_extractor_type": "EncodecFeatureExtractor",
    "feature_size": 1,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": True,
    "sampling_rate": 24000,
}


def write_config_files(
    cfg: Qwen3TTSConfig,
    directory: str,
    mimi_encoder: dict[str, object] | None = None,
    transformers_version: str = "4.57.3",
) -> None:
    """config.json, generation_config.json, speech_tokenizer/{config,preprocessor_config}.json + tokenizer.

    ``transformers_version`` is recorded in config.json as the released files do (it decides the
    official loader's tokenizer regex, see tokenizer.py).
    """
    os.makedirs(os.path.join(directory, "speech_tokenizer"), exist_ok=True)
    config, speech, generation = config_to_json(dataclasses.replace(cfg, transformers_version=transformers_version))
    if mimi_encoder is not None:  # else the config's own (the tiny presets carry a small one)
        speech["encoder_config"] = dict(mimi_encoder)
    files = {
        "config.json": config,
        "generation_config.json": generation,
        "speech_tokenizer/config.json": speech,
        "speech_tokenizer/preprocessor_config.json": SPEECH_PREPROCESSOR,
    }
    for name, data in files.items():
        with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
    write_tokenizer_files(directory)


def write_random_checkpoint(
    directory: str,
    size: str = "tiny",
    seed: int = 0,
    shard_max_bytes: int | None = None,
    model_type: str = "custom_voice",
) -> Qwen3TTSConfig:
    """A complete random-weight checkpoint written by our writer (loader tests without the oracle)."""
    import torch

    cfg = preset(size, model_type)
    mods = build_modules(cfg, "cpu", torch.float32, torch.float32)
    randomize(mods, seed)
    write_config_files(cfg, directory)
    save_checkpoint(mods, cfg, directory, shard_max_bytes)
    return cfg


def streaming_deviation(codec: CodecDecoder, n_frames: int, schedule: ChunkSchedule, seed: int = 0) -> float:
    """Max |streamed - offline| of the codec decoder on random codes (2 streams) cut by ``schedule``."""
    dev = next(codec.parameters()).device
    codes = torch.from_numpy(np.random.default_rng(seed).integers(0, 2048, (2, 16, n_frames))).to(dev)
    offline = codec.decode(codes)
    state, start = codec.fresh_state(2)
    pieces, t, i = [], 0, 0
    while t < n_frames:
        n = min(schedule.frames_for(i), n_frames - t)
        pcm, state, start = codec.stream(codes[..., t : t + n], state, start)
        pieces.append(pcm)
        t, i = t + n, i + 1
    return float((torch.cat(pieces, dim=1) - offline).abs().max())
