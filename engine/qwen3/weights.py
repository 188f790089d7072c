"""Checkpoints in the official Hugging Face layout: load, write, and random weights.

    DIR/config.json                      talker + code predictor (+ speaker encoder) config
    DIR/generation_config.json           sampling defaults (optional here)
    DIR/model.safetensors                or model.safetensors.index.json + shards
    DIR/vocab.json, DIR/merges.txt       Qwen2 BPE (+ tokenizer_config.json: special tokens)
    DIR/speech_tokenizer/config.json     12 Hz codec config
    DIR/speech_tokenizer/model.safetensors

Official tensor names map onto our modules by prefix (``MAIN_PREFIXES``); the codec's per-codebook
RVQ tensors are stacked into one table. The serving load skips what a frame step never runs (the
Mimi encoder, the decoder RVQ's input projections) and keeps the Base speaker encoder's tensors
aside; voice cloning loads both encoders on its own (``load_speaker_encoder``,
``load_codec_encoder``). A missing tensor or a wrong shape raises :class:`CheckpointError` with the
file and tensor name.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from .code_predictor import CodePredictor
from .codec_decoder import CodecDecoder
from .codec_encoder import CodecEncoder
from .config import Qwen3TTSConfig
from .errors import CheckpointError
from .hf_config import config_from_json, config_to_json
from .rope import inv_freq
from .speaker_encoder import SpeakerEncoder
from .talker import Talker

log = logging.getLogger(__name__)

# official prefix -> ours, first match wins (code predictor before the generic talker prefix)
MAIN_PREFIXES = (
    ("talker.code_predictor.model.", "code_predictor."),
    ("talker.code_predictor.", "code_predictor."),
    ("talker.model.", "talker."),
    ("talker.", "talker."),
)
SKIPPED_MAIN = ("speaker_encoder.",)  # Base: kept aside for voice cloning (load_speaker_encoder)
SKIPPED_CODEC = re.compile(r"^encoder\.|^decoder\.quantizer\.rvq_(first|rest)\.input_proj\.")
_RVQ = re.compile(
    r"^decoder\.quantizer\.rvq_(first|rest)\.vq\.layers\.(\d+)\._codebook\.(embedding_sum|cluster_usage)$"
)
_RVQ_PROJ = re.compile(r"^decoder\.quantizer\.rvq_(first|rest)\.output_proj\.weight$")


@dataclass
class Modules:
    talker: Talker
    code_predictor: CodePredictor
    codec: CodecDecoder

    def all(self) -> Iterator[tuple[str, nn.Module]]:
        yield "talker", self.talker
        yield "code_predictor", self.code_predictor
        yield "codec", self.codec


def build_modules(
    cfg: Qwen3TTSConfig, device: torch.device | str, dtype: torch.dtype, codec_dtype: torch.dtype
) -> Modules:
    """Modules with uninitialized weights (``to_empty``); fill them with ``load_into`` or ``randomize``."""
    with torch.device("meta"):
        talker = Talker(cfg.talker)
        cp = CodePredictor(cfg.code_predictor, cfg.talker.hidden_size)
        codec = CodecDecoder(cfg.codec)
    mods = Modules(talker, cp, codec)
    for _, m in mods.all():
        m.to_empty(device=device)
    talker.to(dtype)
    cp.to(dtype)
    codec.to(codec_dtype)
    # buffers are not in checkpoints: recompute them on the real device
    talker.rope_freqs = inv_freq(cfg.talker.head_dim, cfg.talker.rope_theta).to(device)
    cp.rope_freqs = inv_freq(cfg.code_predictor.head_dim, cfg.code_predictor.rope_theta).to(device)
    codec.pre_transformer.rope_freqs = inv_freq(cfg.codec.head_dim, cfg.codec.rope_theta).to(device)
    return mods


# --- reading ---------------------------------------------------------------------------------------
def read_config(directory: str) -> Qwen3TTSConfig:
    if not os.path.isdir(directory):
        raise CheckpointError(f"checkpoint directory {directory!r} does not exist")
    main = _read_json(os.path.join(directory, "config.json"))
    speech = _read_json(os.path.join(directory, "speech_tokenizer", "config.json"))
    gen_path = os.path.join(directory, "generation_config.json")
    gen = _read_json(gen_path) if os.path.isfile(gen_path) else None
    return config_from_json(main, speech, gen)


def load_into(mods: Modules, directory: str) -> dict[str, Tensor]:
    """Copy a checkpoint's tensors into ``mods``; returns the skipped Base speaker-encoder tensors (CPU)."""
    expected = {f"{name}.{k}": p for name, m in mods.all() for k, p in m.state_dict(keep_vars=True).items()}
    filled: set[str] = set()
    speaker: dict[str, Tensor] = {}
    unexpected: list[str] = []

    def put(ours: str, value: Tensor, source: str, index: int | None = None) -> None:
        target = expected.get(ours)
        if target is None:
            unexpected.append(source)
            return
        dst = target.data if index is None else target.data[index]
        if tuple(dst.shape) != tuple(value.shape):
            raise CheckpointError(
                f"{source}: shape {tuple(value.shape)} does not fit the config (expected {tuple(dst.shape)})"
            )
        dst.copy_(value.to(dst.dtype))
        filled.add(ours if index is None else f"{ours}[{index}]")

    main_dir = directory
    for key, tensor, source in _iter_tensors(main_dir, "model"):
        if key.startswith(SKIPPED_MAIN):
            speaker[key] = tensor
            continue
        ours = next((new + key[len(old) :] for old, new in MAIN_PREFIXES if key.startswith(old)), None)
        if ours is None:
            unexpected.append(source)
            continue
        put(ours, tensor, source)

    codec_dir = os.path.join(directory, "speech_tokenizer")
    n_first = mods.codec.cfg.num_semantic_quantizers
    for key, tensor, source in _iter_tensors(codec_dir, "model"):
        if SKIPPED_CODEC.match(key):
            continue
        m = _RVQ.match(key)
        if m:
            index = int(m.group(2)) + (0 if m.group(1) == "first" else n_first)
            name = "codebook_sum" if m.group(3) == "embedding_sum" else "cluster_usage"
            if index >= mods.codec.cfg.num_quantizers:
                raise CheckpointError(
                    f"{source}: more codebooks than the config's {mods.codec.cfg.num_quantizers}"
                )
            put(f"codec.{name}", tensor, source, index)
            continue
        m = _RVQ_PROJ.match(key)
        if m:
            put(f"codec.proj_{m.group(1)}", tensor.squeeze(-1), source)
            continue
        if key.startswith("decoder."):
            put("codec." + key[len("decoder.") :], tensor, source)
        else:
            unexpected.append(source)

    missing = []
    for name, p in expected.items():
        if name in ("codec.codebook_sum", "codec.cluster_usage"):
            missing += [f"{name}[{i}]" for i in range(p.shape[0]) if f"{name}[{i}]" not in filled]
        elif name not in filled:
            missing.append(name)
    if missing:
        raise CheckpointError(
            f"{directory}: {len(missing)} tensors missing, e.g. {', '.join(sorted(missing)[:5])} "
            "(names in our modules; official names: talker.model.* / talker.code_predictor.* / "
            "speech_tokenizer decoder.*)"
        )
    if unexpected:
        # The official loader only warns about unused tensors; we do the same, loudly.
        log.warning("checkpoint %s: %d unused tensors, e.g. %s", directory, len(unexpected), unexpected[:5])
    return speaker


def load_speaker_encoder(
    cfg: Qwen3TTSConfig,
    tensors: Mapping[str, Tensor],
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> SpeakerEncoder:
    """The Base speaker encoder from the ``speaker_encoder.*`` tensors ``load_into`` kept aside."""
    if cfg.speaker_encoder is None:
        raise CheckpointError(f"a {cfg.model_type} checkpoint has no speaker encoder (Base only)")
    module = SpeakerEncoder(cfg.speaker_encoder)
    prefix = "speaker_encoder."
    ours = {
        k[len(prefix) :]: (v, f"model.safetensors: {k}") for k, v in tensors.items() if k.startswith(prefix)
    }
    _load_strict(module, ours, "the speaker encoder (config.json speaker_encoder_config)")
    return module.to(device=device, dtype=dtype).eval().requires_grad_(False)


# the encoder tensors no encode needs: the RVQ's way back (decode only), a bookkeeping flag
_UNUSED_ENCODER = re.compile(r"\.output_proj\.|\.codebook\.initialized$")


def load_codec_encoder(
    cfg: Qwen3TTSConfig,
    directory: str,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> CodecEncoder:
    """The speech tokenizer's encoder from ``speech_tokenizer/model.safetensors`` (``encoder.*``)."""
    module = CodecEncoder(cfg.codec_encoder)
    ours = {
        key[len("encoder.") :]: (tensor, source)
        for key, tensor, source in _iter_tensors(os.path.join(directory, "speech_tokenizer"), "model")
        if key.startswith("encoder.") and not _UNUSED_ENCODER.search(key)
    }
    _load_strict(module, ours, "the speech tokenizer's encoder (speech_tokenizer/config.json encoder_config)")
    return module.to(device=device, dtype=dtype).eval().requires_grad_(False)


def _load_strict(module: nn.Module, tensors: Mapping[str, tuple[Tensor, str]], what: str) -> None:
    """Every parameter of ``module`` from ``tensors`` (name -> (tensor, source)); nothing left over."""
    expected = module.state_dict(keep_vars=True)
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise CheckpointError(f"{what}: {len(missing)} tensors missing, e.g. {', '.join(missing[:5])}")
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise CheckpointError(
            f"{what}: unexpected tensors, e.g. {', '.join(tensors[k][1] for k in extra[:5])}"
        )
    with torch.no_grad():
        for name, p in expected.items():
            value, source = tensors[name]
            if tuple(value.shape) != tuple(p.shape):
                raise CheckpointError(
                    f"{source}: shape {tuple(value.shape)} does not fit the config (expected {tuple(p.shape)})"
                )
            p.copy_(value.to(p.dtype))


def _iter_tensors(directory: str, stem: str) -> Iterator[tuple[str, Tensor, str]]:
    """(name, tensor on CPU, "file: name") of ``stem.safetensors`` or its sharded index."""
    single = os.path.join(directory, f"{stem}.safetensors")
    index = os.path.join(directory, f"{stem}.safetensors.index.json")
    if os.path.isfile(single):
        files = [single]
    elif os.path.isfile(index):
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, Mapping) or not weight_map:
            raise CheckpointError(f"{index}: no weight_map")
        files = [os.path.join(directory, f) for f in sorted(set(weight_map.values()))]
        for f in files:
            if not os.path.isfile(f):
                raise CheckpointError(f"{index} names shard {os.path.basename(f)}, which is missing")
    else:
        raise CheckpointError(f"missing {single} (or {os.path.basename(index)} with its shards)")
    for path in files:
        try:
            with safe_open(path, framework="pt", device="cpu") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                    yield (
                        name,
                        f.get_tensor(name),
                        f"{os.path.relpath(path, os.path.dirname(directory))}: {name}",
                    )
        except CheckpointError:
            raise
        except Exception as err:  # a truncated or foreign file
            raise CheckpointError(f"cannot read {path}: {err}") from err


def _read_json(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        raise CheckpointError(f"missing {path}")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as err:
        raise CheckpointError(f"unreadable {path}: {err}") from err
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


# --- writing (random checkpoints for tests and side-by-side runs) ---------------------------------
def official_state_dicts(mods: Modules) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(main model tensors, speech-tokenizer tensors) under the official names."""
    main: dict[str, Tensor] = {}
    for k, v in mods.talker.state_dict().items():
        top = k.split(".")[0]
        main[("talker." if top in ("text_projection", "codec_head") else "talker.model.") + k] = v
    for k, v in mods.code_predictor.state_dict().items():
        top = k.split(".")[0]
        prefix = (
            "talker.code_predictor."
            if top in ("lm_head", "small_to_mtp_projection")
            else "talker.code_predictor.model."
        )
        main[prefix + k] = v
    codec: dict[str, Tensor] = {}
    c = mods.codec
    n_first = c.cfg.num_semantic_quantizers
    for k, v in c.state_dict().items():
        if k in ("codebook_sum", "cluster_usage"):
            name = "embedding_sum" if k == "codebook_sum" else "cluster_usage"
            for i in range(v.shape[0]):
                group, j = ("first", i) if i < n_first else ("rest", i - n_first)
                codec[f"decoder.quantizer.rvq_{group}.vq.layers.{j}._codebook.{name}"] = v[i]
        elif k in ("proj_first", "proj_rest"):
            codec[f"decoder.quantizer.rvq_{k[5:]}.output_proj.weight"] = v[..., None]
        else:
            codec["decoder." + k] = v
    return main, codec


def save_checkpoint(
    mods: Modules,
    cfg: Qwen3TTSConfig,
    directory: str,
    shard_max_bytes: int | None = None,
    extra_main: Mapping[str, Tensor] | None = None,
) -> None:
    """Write config + weights in the official layout (no tokenizer files: see testing.py)."""
    os.makedirs(os.path.join(directory, "speech_tokenizer"), exist_ok=True)
    config, speech, generation = config_to_json(cfg)
    for path, data in (
        ("config.json", config),
        ("generation_config.json", generation),
        ("speech_tokenizer/config.json", speech),
    ):
        with open(os.path.join(directory, path), "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
    main, codec = official_state_dicts(mods)
    main.update(extra_main or {})
    _save(main, directory, "model", shard_max_bytes)
    _save(codec, os.path.join(directory, "speech_tokenizer"), "model", None)


def _save(tensors: Mapping[str, Tensor], directory: str, stem: str, shard_max_bytes: int | None) -> None:
    data = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    if shard_max_bytes is None:
        save_file(data, os.path.join(directory, f"{stem}.safetensors"), metadata={"format": "pt"})
        return
    shards: list[dict[str, Tensor]] = [{}]
    size = 0
    for k, v in data.items():
        nbytes = v.numel() * v.element_size()
        if shards[-1] and size + nbytes > shard_max_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = v
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"{stem}-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(directory, name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
    with open(os.path.join(directory, f"{stem}.safetensors.index.json"), "w", encoding="utf-8") as f:
        json.dump(
            {
                "metadata": {"total_size": sum(v.numel() * v.element_size() for v in data.values())},
                "weight_map": weight_map,
            },
            f,
        )


# --- random weights --------------------------------------------------------------------------------
@torch.no_grad()
def randomize(mods: Modules, seed: int) -> None:
    """Random weights that exercise every path: no zero branches, no identity norms.

    Matrices and embeddings N(0, 0.02) as the reference initializes them; biases and norm weights
    perturbed; the codec's RVQ sums N(0, 1) with usage in [0.5, 2] (the reference leaves them at zero),
    LayerScale / ConvNeXt gamma large enough (0.2..0.6) that attention and ConvNeXt reach the output
    (at their 0.01 / 1e-6 inits a broken streaming state would hide below the test tolerance), and
    codec convolutions scaled by fan-in so the waveform stays well inside the clamp.
    """
    first_device = next(mods.talker.parameters()).device
    gen = torch.Generator(device=first_device).manual_seed(seed)

    def normal(p: Tensor, std: float, mean: float = 0.0) -> None:
        p.copy_((torch.randn(p.shape, generator=gen, device=first_device) * std + mean).to(p.dtype))

    def uniform(p: Tensor, lo: float, hi: float) -> None:
        p.copy_((torch.rand(p.shape, generator=gen, device=first_device) * (hi - lo) + lo).to(p.dtype))

    for _, module in mods.all():
        for name, p in module.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            owner = module.get_submodule(name.rsplit(".", 1)[0]) if "." in name else module
            if name == "codebook_sum":
                normal(p, 1.0)
            elif name == "cluster_usage":
                uniform(p, 0.5, 2.0)
            elif name in ("proj_first", "proj_rest"):
                normal(p, p.shape[1] ** -0.5)
            elif leaf == "scale" or leaf == "gamma":
                uniform(p, 0.2, 0.6)
            elif leaf in ("alpha", "beta"):
                normal(p, 0.1)
            elif leaf == "weight" and p.dim() == 1:  # RMS / layer norms
                normal(p, 0.05, 1.0)
            elif leaf == "bias":
                normal(p, 0.02)
            elif isinstance(owner, nn.Conv1d | nn.ConvTranspose1d):
                fan_in = (
                    p.shape[1] * p.shape[2]
                    if isinstance(owner, nn.Conv1d)
                    else p.shape[0] * p.shape[2] // max(1, owner.stride[0])
                )
                normal(p, 0.5 * fan_in**-0.5)
            elif module is mods.codec and p.dim() == 2:
                normal(p, p.shape[1] ** -0.5)
            else:
                normal(p, 0.02)
