"""The official qwen-tts 0.1.1 on the GPU, for the side-by-side run (benchmarks/side_by_side.py).

Runs in the oracle environment only (PYTHONPATH = the folder the oracle wheels were installed to:
transformers 4.57.3 shadows the image's 5.x for this process); imports nothing of ours.

    python3 official_qwen_tts.py --dir CKPT --out official.json [--build]

``--build``: CKPT holds our config.json, generation config, speech-tokenizer config and tokenizer
files (engine/qwen3/testing.py writes them); the official classes are built from those configs on the
GPU in bf16, every parameter is given a random value, and the package's ``save_pretrained`` writes
the weights there (our config files are put back: the package cannot read back its own
speaker_encoder_config). Our engine then loads the same directory: same weights on both sides.

Then, through the package's public entry (``Qwen3TTSModel.from_pretrained``), with the lengths forced
as research/peer_baseline/bench_qwen3_tts.py does (``min_new_tokens = max_new_tokens``) and the
released sampling defaults (top-k 50, temperature 0.9, repetition penalty 1.05, sampled code
predictor):

* decode ms per frame at batch B: (t(n2 new tokens) - t(n1)) / (n2 - n1), the prefill and the final
  code2wav cancelling out; aggregate x real time = B x 80 ms / that;
* end to end for a 10-s utterance (125 frames), batch 1, text to waveform: the package does not
  stream, so this is its time to first audio;
* with ``--e2e-batch``, the same at the batch size of its best decode throughput: text to waveforms
  (its batched code2wav included), aggregate audio-s per wall second.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import statistics
import time

import torch

FRAME_MS = 80.0
TEXT = (
    "The quick brown fox jumps over the lazy dog while the evening sun sets slowly behind the distant "
    "hills and a gentle breeze carries the scent of rain across the quiet valley"
)


DEVICE = "cuda"


def sync() -> None:
    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn):  # type: ignore[no-untyped-def]
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return time.perf_counter() - t0, out


def build_and_save(d: str, seed: int) -> dict[str, float]:
    from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration

    t0 = time.perf_counter()
    keep = {}
    for rel in (
        "config.json",
        "generation_config.json",
        "speech_tokenizer/config.json",
        "speech_tokenizer/preprocessor_config.json",
    ):
        with open(os.path.join(d, rel)) as f:
            keep[rel] = f.read()
    torch.manual_seed(seed)
    cfg = Qwen3TTSConfig.from_pretrained(d)
    st_cfg = Qwen3TTSTokenizerV2Config.from_pretrained(os.path.join(d, "speech_tokenizer"))
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # what from_pretrained(dtype=bf16) does during init
    try:
        with torch.device(DEVICE):
            model = Qwen3TTSForConditionalGeneration(cfg).eval()
            st_model = Qwen3TTSTokenizerV2Model(st_cfg).eval()
    finally:
        torch.set_default_dtype(old)
    with torch.no_grad():  # random everywhere (never time on zeros); HF init draws N(0, 0.02) matrices
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.02)
            elif p.dim() == 1:
                p.normal_(1.0, 0.05)
            elif name.startswith("speaker_encoder."):
                p.normal_(0.0, 0.05)
            else:
                p.normal_(0.0, 0.02)
        for name, p in st_model.decoder.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "embedding_sum":
                p.normal_()
            elif leaf == "cluster_usage":
                p.uniform_(0.5, 2.0)
            elif leaf in ("scale", "gamma"):
                p.uniform_(0.2, 0.6)
            elif leaf in ("alpha", "beta"):
                p.normal_(0.0, 0.1)
            elif leaf == "bias":
                p.normal_(0.0, 0.02)
            elif p.dim() == 1:
                p.normal_(1.0, 0.05)
            else:
                p.normal_(0.0, 0.5 * (p[0].numel()) ** -0.5)
    t1 = time.perf_counter()
    model.save_pretrained(d)
    st_model.save_pretrained(os.path.join(d, "speech_tokenizer"))
    for rel, text in keep.items():
        with open(os.path.join(d, rel), "w") as f:
            f.write(text)
    del model, st_model
    if DEVICE.startswith("cuda"):
        torch.cuda.empty_cache()
    return {"build_random_s": t1 - t0, "save_s": time.perf_counter() - t1}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--build", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batches", default="1,64,128")
    ap.add_argument("--n1", type=int, default=4)
    ap.add_argument("--n2", type=int, default=24)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--e2e-frames", type=int, default=125)
    ap.add_argument("--e2e-batch", action="store_true", help="also end to end at the best decode batch")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    res: dict = {"versions": {}, "args": vars(args)}
    for name in ("torch", "transformers", "qwen-tts", "tokenizers", "huggingface_hub"):
        try:
            res["versions"][name] = md.version(name)
        except Exception:
            res["versions"][name] = None

    def save() -> None:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1, default=str)

    if args.build:
        res["build"] = build_and_save(args.dir, args.seed)
        print("built", res["build"], flush=True)
        save()

    from qwen_tts import Qwen3TTSModel

    t0 = time.perf_counter()
    tts = Qwen3TTSModel.from_pretrained(args.dir, dtype=torch.bfloat16, device_map=DEVICE)
    res["load_s"] = time.perf_counter() - t0
    model = tts.model
    res["attn_implementation"] = {
        "talker": model.talker.config._attn_implementation,
        "code_predictor": model.talker.code_predictor.config._attn_implementation,
    }
    talker_generate = model.talker.generate

    def forced_generate(*a, **kw):  # type: ignore[no-untyped-def]
        kw["min_new_tokens"] = kw["max_new_tokens"]
        return talker_generate(*a, **kw)

    model.talker.generate = forced_generate
    input_ids = tts._tokenize_texts([tts._build_assistant_text(TEXT)])
    res["prompt_text_ids"] = int(input_ids[0].shape[1])
    gen_kw = tts._merge_generate_kwargs()
    res["generate_kwargs"] = {k: v for k, v in gen_kw.items() if isinstance(v, int | float | bool | str)}

    def gen(batch: int, n_new: int):  # type: ignore[no-untyped-def]
        kw = dict(gen_kw, max_new_tokens=n_new)
        with torch.no_grad():
            return model.generate(
                input_ids=input_ids * batch,
                instruct_ids=[None] * batch,
                languages=["english"] * batch,
                speakers=["ryan"] * batch,
                non_streaming_mode=True,
                **kw,
            )

    dec = {}
    for b in [int(x) for x in args.batches.split(",") if x]:
        try:
            gen(b, args.n1)  # warm-up at this batch size
            per = []
            for _ in range(args.reps):
                t1, _ = timed(lambda b=b: gen(b, args.n1))
                t2, out = timed(lambda b=b: gen(b, args.n2))
                assert len(out[0]) == b and all(c.shape[0] == args.n2 - 1 for c in out[0])
                per.append((t2 - t1) / (args.n2 - args.n1) * 1e3)
            ms = statistics.median(per)
            dec[str(b)] = {
                "ms_per_frame_runs": per,
                "ms_per_frame": ms,
                "rtf_per_stream": ms / FRAME_MS,
                "aggregate_x_realtime": b * FRAME_MS / ms,
            }
        except torch.OutOfMemoryError as err:
            dec[str(b)] = {"error": "OOM " + str(err)[:200]}
        except Exception as err:
            dec[str(b)] = {"error": repr(err)[:400]}
        print(f"official decode B={b}: {dec[str(b)]}", flush=True)
        res["decode"] = dec
        save()

    n_new = args.e2e_frames + 1

    def e2e():  # type: ignore[no-untyped-def]
        with torch.no_grad():
            return tts.generate_custom_voice(
                text=TEXT, speaker="ryan", language="english", max_new_tokens=n_new
            )

    try:
        with torch.no_grad():
            tts.generate_custom_voice(text=TEXT, speaker="ryan", language="english", max_new_tokens=6)
        t, (wavs, sr) = timed(e2e)
        res["e2e_b1"] = {
            "frames": args.e2e_frames,
            "audio_s": wavs[0].shape[0] / sr,
            "s": t,
            "time_to_first_audio_s": t,
            "rtf": t / (wavs[0].shape[0] / sr),
        }
    except Exception as err:
        res["e2e_b1"] = {"error": repr(err)[:400]}
    print("official e2e", res["e2e_b1"], flush=True)
    save()

    # end to end at the best decode batch: generate + its batched code2wav, audio-s per wall second
    done = {b: v for b, v in dec.items() if "ms_per_frame" in v}
    if done and args.e2e_batch:
        best = max(done, key=lambda b: done[b]["aggregate_x_realtime"])
        batch = int(best)

        def e2e_batched():  # type: ignore[no-untyped-def]
            with torch.no_grad():
                return tts.generate_custom_voice(
                    text=[TEXT] * batch, speaker="ryan", language="english", max_new_tokens=n_new
                )

        try:
            t, (wavs, sr) = timed(e2e_batched)
            audio_s = sum(w.shape[0] for w in wavs) / sr
            res["e2e_batched"] = {
                "batch": batch,
                "frames": args.e2e_frames,
                "audio_s": audio_s,
                "s": t,
                "audio_s_per_s": audio_s / t,
            }
        except Exception as err:
            res["e2e_batched"] = {"error": repr(err)[:400]}
        print("official e2e batched", res["e2e_batched"], flush=True)
        save()


if __name__ == "__main__":
    main()
