"""The official qwen-tts 0.1.1 as an oracle: random weights in, reference codes and waveforms out.

Runs in the oracle environment only (PYTHONPATH = the folder oracle_setup.sh fills), as a
subprocess of the parity tests or of benchmarks/gpu_qwen3_check.py; it imports nothing of ours.

    python oracle_run.py JOB.json OUT.npz

For each checkpoint directory of the job (which already holds our config.json, speech-tokenizer
config, generation config and tokenizer files):

1. build the official model from those configs, give every parameter a random value (seeded),
   and write it with the official ``save_pretrained`` (sharded when asked), so the weights on
   disk are in the layout the package itself writes;
2. load the directory back through the package's public entry, ``Qwen3TTSModel.from_pretrained``;
3. per prompt, greedy codes with the length forced (``min_new_tokens = max_new_tokens``, as in
   research/peer_baseline/bench_qwen3_tts.py) and text streamed one token per frame
   (``non_streaming_mode=False``), then the package's waveform of those codes; and the waveform of
   a random code matrix;
4. Base checkpoints with a ``clone`` entry: per reference clip (a .npy the job names), the package's
   log-mel features, x-vector and reference codes (``create_voice_clone_prompt``); per clone case,
   the greedy codes of ``generate_voice_clone``'s path (x-vector only, or in-context with the
   reference transcript), length forced as above.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch


def randomize_talker(model: torch.nn.Module, gen: torch.Generator) -> None:
    """HF init (N(0, 0.02)) plus perturbed norms and biases, so no parameter is at an identity value."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("speaker_encoder.") and p.dim() == 3:
                # He-scaled, so ReLU activations stay O(1); the last 1x1 conv scaled down to an x-vector
                # of about 0.5 rms (log-mel inputs are O(10), so an O(1) weight there gives O(30))
                gain = 0.02 if name == "speaker_encoder.fc.weight" else 2.0**0.5
                p.copy_(torch.randn(p.shape, generator=gen) * gain * (p.shape[1] * p.shape[2]) ** -0.5)
            elif name.startswith("speaker_encoder."):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
            elif p.dim() == 1:
                p.copy_(1.0 + torch.randn(p.shape, generator=gen) * 0.05)


def randomize_codec(st_model: torch.nn.Module, gen: torch.Generator) -> None:
    """Every decoder parameter random, at magnitudes where attention, ConvNeXt and SnakeBeta matter."""
    with torch.no_grad():
        for name, p in st_model.decoder.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "embedding_sum":
                p.copy_(torch.randn(p.shape, generator=gen))
            elif leaf == "cluster_usage":
                p.copy_(torch.rand(p.shape, generator=gen) * 1.5 + 0.5)
            elif leaf in ("scale", "gamma"):
                p.copy_(torch.rand(p.shape, generator=gen) * 0.4 + 0.2)
            elif leaf in ("alpha", "beta"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
            elif leaf == "bias":
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
            elif p.dim() == 1:
                p.copy_(1.0 + torch.randn(p.shape, generator=gen) * 0.05)
            elif p.dim() == 3:  # conv weights: fan-in scaled
                owner = st_model.decoder.get_submodule(name.rsplit(".", 1)[0])
                if isinstance(owner, torch.nn.ConvTranspose1d):
                    fan_in = p.shape[0] * p.shape[2] // owner.stride[0]
                else:
                    fan_in = p.shape[1] * p.shape[2]
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5 * fan_in**-0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * p.shape[1] ** -0.5)


def randomize_codec_encoder(encoder: torch.nn.Module, gen: torch.Generator) -> None:
    """The Mimi encoder random too (HF leaves its codebooks at zero: every code would be 0): convs and
    linears fan-in scaled, norms and layer scales perturbed, codebook sums N(0, 1), usage in [0.5, 2]."""
    with torch.no_grad():
        for name, p in [*encoder.named_parameters(), *encoder.named_buffers()]:
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "embed_sum":
                p.copy_(torch.randn(p.shape, generator=gen))
            elif leaf == "cluster_usage":
                p.copy_(torch.rand(p.shape, generator=gen) * 1.5 + 0.5)
            elif leaf == "scale":
                p.copy_(torch.rand(p.shape, generator=gen) * 0.4 + 0.2)
            elif leaf == "bias":
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
            elif not p.is_floating_point() or leaf == "initialized" or name.endswith("inv_freq"):
                continue
            elif p.dim() == 1:
                p.copy_(1.0 + torch.randn(p.shape, generator=gen) * 0.05)
            elif p.dim() == 3:
                p.copy_(torch.randn(p.shape, generator=gen) * (p.shape[1] * p.shape[2]) ** -0.5)
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * p.shape[1] ** -0.5)


def build_and_save(ckpt: dict, dtype: torch.dtype) -> None:
    from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration

    d = ckpt["dir"]
    # save_pretrained rewrites these; the released checkpoints ship hand-written ones (the package
    # cannot even read back its own speaker_encoder_config), so ours go back afterwards
    keep = {}
    for rel in (
        "config.json",
        "generation_config.json",
        "speech_tokenizer/config.json",
        "speech_tokenizer/preprocessor_config.json",
    ):
        with open(os.path.join(d, rel)) as f:
            keep[rel] = f.read()
    torch.manual_seed(ckpt["seed"])
    gen = torch.Generator().manual_seed(ckpt["seed"])
    cfg = Qwen3TTSConfig.from_pretrained(d)
    model = Qwen3TTSForConditionalGeneration(cfg).eval()
    randomize_talker(model, gen)
    st_cfg = Qwen3TTSTokenizerV2Config.from_pretrained(os.path.join(d, "speech_tokenizer"))
    st_model = Qwen3TTSTokenizerV2Model(st_cfg).eval()
    randomize_codec(st_model, gen)
    randomize_codec_encoder(st_model.encoder, gen)
    shard = ckpt.get("max_shard_size")
    model.to(dtype).save_pretrained(d, max_shard_size=shard) if shard else model.to(dtype).save_pretrained(d)
    st_model.to(dtype).save_pretrained(os.path.join(d, "speech_tokenizer"))
    for rel, text in keep.items():
        with open(os.path.join(d, rel), "w") as f:
            f.write(text)


def run_checkpoint(ckpt: dict, device: str, dtype: torch.dtype, out: dict[str, np.ndarray]) -> None:
    from qwen_tts import Qwen3TTSModel

    name = ckpt["name"]
    tts = Qwen3TTSModel.from_pretrained(ckpt["dir"], dtype=dtype, device_map=device)
    model = tts.model
    talker_generate = model.talker.generate

    def forced_generate(*a, **kw):  # stand-in for EOS with random weights (peer baseline trick)
        kw["min_new_tokens"] = kw["max_new_tokens"]
        return talker_generate(*a, **kw)

    model.talker.generate = forced_generate
    for i, p in enumerate(ckpt["prompts"]):
        input_ids = tts._tokenize_texts([tts._build_assistant_text(p["text"])])
        kw = tts._merge_generate_kwargs(
            do_sample=False, subtalker_dosample=False, max_new_tokens=p["frames"] + 1
        )
        with torch.no_grad():
            codes, _ = model.generate(
                input_ids=input_ids,
                instruct_ids=[None],
                languages=[p["language"]],
                speakers=[p["speaker"]],
                non_streaming_mode=bool(p.get("whole_text", False)),
                **kw,
            )
            wavs, sr = model.speech_tokenizer.decode([{"audio_codes": codes[0]}])
        assert sr == 24000
        out[f"{name}/p{i}/input_ids"] = input_ids[0][0].cpu().numpy()
        out[f"{name}/p{i}/codes"] = codes[0].cpu().numpy()
        out[f"{name}/p{i}/wav"] = np.asarray(wavs[0], dtype=np.float32)
    n = ckpt.get("random_frames", 0)
    if n:
        g = torch.Generator().manual_seed(1234)
        codes = torch.randint(0, 2048, (n, 16), generator=g)
        with torch.no_grad():
            wavs, _ = model.speech_tokenizer.decode([{"audio_codes": codes.to(device)}])
        out[f"{name}/random_codes"] = codes.numpy()
        out[f"{name}/random_wav"] = np.asarray(wavs[0], dtype=np.float32)
    if "clone" in ckpt:
        run_clone(ckpt, tts, out)


def run_clone(ckpt: dict, tts, out: dict[str, np.ndarray]) -> None:  # tts: the package's Qwen3TTSModel
    from qwen_tts.core.models.modeling_qwen3_tts import mel_spectrogram

    name, model = ckpt["name"], tts.model
    refs = ckpt["clone"]["refs"]
    wavs = [np.load(r["path"]) for r in refs]
    for j, (r, wav) in enumerate(zip(refs, wavs, strict=True)):
        (item,) = tts.create_voice_clone_prompt(ref_audio=(wav, r["rate_hz"]), ref_text=r["text"])
        out[f"{name}/ref{j}/xvec"] = item.ref_spk_embedding.float().cpu().numpy()
        out[f"{name}/ref{j}/codes"] = item.ref_code.cpu().numpy()
        if r["rate_hz"] == 24000:  # the speaker encoder's features, as extract_speaker_embedding makes them
            mels = mel_spectrogram(
                torch.from_numpy(wav)[None],
                n_fft=1024,
                num_mels=128,
                sampling_rate=24000,
                hop_size=256,
                win_size=1024,
                fmin=0,
                fmax=12000,
            ).transpose(1, 2)
            out[f"{name}/ref{j}/mels"] = mels[0].numpy()
    for i, c in enumerate(ckpt["clone"]["cases"]):
        r, wav = refs[c["ref"]], wavs[c["ref"]]
        # generate_voice_clone's own steps, minus the waveform
        items = tts.create_voice_clone_prompt(
            ref_audio=(wav, r["rate_hz"]),
            ref_text=r["text"] if c["icl"] else None,
            x_vector_only_mode=not c["icl"],
        )
        prompt = tts._prompt_items_to_voice_clone_prompt(items)
        input_ids = tts._tokenize_texts([tts._build_assistant_text(c["text"])])
        ref_ids = [tts._tokenize_texts([tts._build_ref_text(r["text"])])[0] if c["icl"] else None]
        kw = tts._merge_generate_kwargs(
            do_sample=False, subtalker_dosample=False, max_new_tokens=c["frames"] + 1
        )
        with torch.no_grad():
            codes, _ = model.generate(
                input_ids=input_ids,
                ref_ids=ref_ids,
                voice_clone_prompt=prompt,
                languages=[c["language"]],
                non_streaming_mode=bool(c.get("whole_text", False)),
                **kw,
            )
        out[f"{name}/c{i}/codes"] = codes[0].cpu().numpy()
        if c["icl"]:
            out[f"{name}/c{i}/ref_ids"] = ref_ids[0][0].cpu().numpy()


def main() -> None:
    job_path, out_path = sys.argv[1], sys.argv[2]
    with open(job_path) as f:
        job = json.load(f)
    device = job.get("device", "cpu")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[job.get("dtype", "float32")]
    torch.set_num_threads(max(1, int(job.get("threads", 2))))
    # fp32 means fp32 on a GPU too: no TF32 in cuDNN convolutions (on by default) or matmuls
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    out: dict[str, np.ndarray] = {}
    for ckpt in job["checkpoints"]:
        if ckpt.get("build", True):
            build_and_save(ckpt, dtype)
        run_checkpoint(ckpt, device, dtype, out)
    import qwen_tts  # noqa: F401  (version record)
    import transformers

    out["versions"] = np.array(
        json.dumps({"transformers": transformers.__version__, "torch": torch.__version__})
    )
    np.savez(out_path, **out)


if __name__ == "__main__":
    main()
