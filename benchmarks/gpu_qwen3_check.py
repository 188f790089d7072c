"""Qwen3-TTS on a CUDA GPU: parity with the official package in fp32, bf16 deviations, streaming == offline.

Run on the lent H200 (carry the oracle wheels, see below; nothing else is needed there):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/oracle_site \
        .whl/qwen3-oracle/*.whl && \
    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_qwen3_check.py --oracle-site /tmp/oracle_site --out $OUT

The wheels (official qwen-tts 0.1.1 and the versions it pins, for the device's Python 3.12) come from
``pip download`` here (command in the module's ``WHEELS`` note). Without ``--oracle-site`` the
parity sections are skipped. Sections, each reported in ``results.json`` even if another fails:

1. parity, fp32: the official package (fp32, TF32 off) makes random tiny checkpoints, greedy codes
   and waveforms on the GPU; ours loads them and must give equal codes and waveforms within 1e-4;
2. bf16: the official package and ours in bf16 on the same weights: code agreement (ours vs theirs,
   each vs fp32) and waveform deviations of the codec in bf16;
3. streaming == offline: the tiny codec and the real-size 12 Hz codec (random weights), three chunk
   schedules, fp32 (must be <= 1e-5) and bf16 (reported);
4. speed, informative only (eager, no CUDA graphs yet): real-shape talkers (0.6B, 1.7B, bf16, random
   weights) ms per frame at batch 1 and 8; the real-size codec per-chunk cost, stateful vs a
   72-frame windowed re-decode.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from voicewire.engine.config import ChunkSchedule  # noqa: E402
from voicewire.engine.model import DecodeWork, StreamParams  # noqa: E402
from voicewire.engine.qwen3 import load_qwen3  # noqa: E402
from voicewire.engine.qwen3.presets import preset  # noqa: E402
from voicewire.engine.qwen3.testing import streaming_deviation  # noqa: E402
from voicewire.engine.qwen3.weights import build_modules, randomize  # noqa: E402

WHEELS = """python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \\
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl/qwen3-oracle \\
  qwen-tts==0.1.1 transformers==4.57.3 tokenizers==0.22.2 huggingface_hub==0.36.2 accelerate==1.12.0 \\
  librosa==0.11.0 audioread==3.1.0 decorator==5.3.1 pooch==1.9.0 platformdirs==4.14.8 soxr==1.1.0 \\
  soundfile==0.14.0 cffi==2.1.1 pycparser==3.12 sox==1.4.1"""

SCHEDULES = {
    "1-2-4-8-12": ChunkSchedule(),
    "1-then-1": ChunkSchedule(first_frames=1, ramp_frames=(), steady_frames=1),
    "2-3-then-7": ChunkSchedule(first_frames=2, ramp_frames=(3,), steady_frames=7),
}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def section(results: dict[str, Any], name: str, fn: Callable[[], Any]) -> None:
    t0 = time.perf_counter()
    print(f"== {name}", flush=True)
    try:
        results[name] = fn()
    except Exception as err:  # keep the other sections
        results[name] = {"error": repr(err), "traceback": traceback.format_exc()[-3000:]}
        print(results[name]["traceback"], flush=True)
    results.setdefault("seconds", {})[name] = round(time.perf_counter() - t0, 2)
    print(json.dumps(results[name], indent=1, default=str)[:4000], flush=True)


def run_codes(model: Any, text: str, params: StreamParams) -> np.ndarray:
    model.open_slot(0, params)
    model.add_text(0, [text], True)
    frames = []
    while model.ready(0):
        r = model.generate([0])[0]
        if r.frames is not None:
            frames.append(r.frames)
        if r.finished:
            break
    model.close_slot(0)
    return np.concatenate(frames)


def decode(model: Any, codes: np.ndarray) -> np.ndarray:
    return model.codec.decode(torch.from_numpy(codes).T[None].to(model.device))[0].cpu().numpy()


def compare_codes(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    eq = a == b
    bad = np.argwhere(~eq)
    return {
        "equal": bool(eq.all()),
        "frames_equal_fraction": float(eq.all(axis=1).mean()),
        "first_mismatch_frame": int(bad[0][0]) if bad.size else None,
    }


def parity(site: str, device: str, work: Path) -> dict[str, Any]:
    from tests.engine.qwen3.oracle import CHECKPOINTS, greedy_params, run_oracle

    site = ":".join(str(Path(p).resolve()) for p in site.split(":"))  # the oracle runs in another cwd
    out: dict[str, Any] = {}
    ref32 = run_oracle(work, device=device, dtype="float32", pythonpath=site)
    ref16 = run_oracle(work, device=device, dtype="bfloat16", pythonpath=site, build=False)
    for c in CHECKPOINTS:
        d = ref32.directory(c["name"])
        ours32 = load_qwen3(d, device=device, max_seq_len=256)
        ours16 = load_qwen3(d, device=device, dtype="bf16", codec_dtype="bf16", max_seq_len=256)
        for i, p in enumerate(c["prompts"]):
            key = f"{c['name']}/p{i}"
            params = greedy_params(p)
            r32, r16 = ref32.ref[f"{key}/codes"], ref16.ref[f"{key}/codes"]
            c32, c16 = run_codes(ours32, p["text"], params), run_codes(ours16, p["text"], params)
            w32 = decode(ours32, r32)
            w16 = decode(ours16, r16)
            out[key] = {
                "fp32_codes_vs_official_fp32": compare_codes(c32, r32),
                "fp32_wave_max_abs_diff": float(np.abs(w32 - ref32.ref[f"{key}/wav"]).max()),
                "bf16_codes_vs_official_bf16": compare_codes(c16, r16),
                "bf16_codes_vs_official_fp32": compare_codes(c16, r32),
                "official_bf16_codes_vs_official_fp32": compare_codes(r16, r32),
                "bf16_wave_vs_official_bf16_same_codes": {
                    "max_abs": float(np.abs(w16 - ref16.ref[f"{key}/wav"]).max()),
                    "mean_abs": float(np.abs(w16 - ref16.ref[f"{key}/wav"]).mean()),
                },
                "bf16_wave_vs_fp32_same_codes": {
                    "max_abs": float(np.abs(decode(ours16, r32) - ref32.ref[f"{key}/wav"]).max()),
                    "signal_std": float(ref32.ref[f"{key}/wav"].std()),
                },
            }
        if f"{c['name']}/random_codes" in ref32.ref:
            rc = ref32.ref[f"{c['name']}/random_codes"]
            out[f"{c['name']}/random_wave_fp32_max_abs_diff"] = float(
                np.abs(decode(ours32, rc) - ref32.ref[f"{c['name']}/random_wav"]).max()
            )
    fp32_ok = all(
        v["fp32_codes_vs_official_fp32"]["equal"] and v["fp32_wave_max_abs_diff"] <= 1e-4
        for k, v in out.items()
        if isinstance(v, dict)
    ) and all(v <= 1e-4 for k, v in out.items() if k.endswith("random_wave_fp32_max_abs_diff"))
    out["fp32_parity_pass"] = fp32_ok
    return out


def streaming(device: str, sizes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for size in sizes:
        for dt in (torch.float32, torch.bfloat16):
            mods = build_modules(preset(size), device, torch.float32, dt)
            randomize(mods, 1)
            codec = mods.codec.eval()
            codec.prepare()
            name = f"codec-{size}-{str(dt).split('.')[-1]}"
            out[name] = {s: streaming_deviation(codec, 100, sch) for s, sch in SCHEDULES.items()}
            del mods, codec
            torch.cuda.empty_cache()
    out["fp32_pass"] = all(v <= 1e-5 for k, d in out.items() if "float32" in k for v in d.values())
    return out


def speed(device: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for size in ("0.6b", "1.7b"):
        model = load_qwen3(
            None,
            size,
            device=device,
            dtype="bf16",
            codec_dtype="bf16",
            max_slots=8,
            max_batch_size=8,
            max_seq_len=256,
        )
        for batch in (1, 8):
            frames = 30
            for s in range(batch):
                model.open_slot(s, StreamParams(forced_frames=frames, seed=s))
                model.add_text(s, ["Speed test with a short sentence of text."], True)
            slots = list(range(batch))
            times = []
            while slots:
                sync()
                t0 = time.perf_counter()
                res = model.generate(slots)
                sync()
                times.append(time.perf_counter() - t0)
                slots = [r.slot for r in res if not r.finished]
            for s in range(batch):
                model.close_slot(s)
            steady = times[2:]
            out[f"{size}-b{batch}-ms_per_step_median"] = 1e3 * float(np.median(steady))
            out[f"{size}-b{batch}-prefill_step_ms"] = 1e3 * times[0]
        if size == "0.6b":
            codec = model.codec
            model.open_slot(0, StreamParams(seed=0))
            codes = np.random.default_rng(0).integers(0, 2048, (200, 16))
            for mode in ("stateful-1-frame", "stateful-12-frames", "windowed72-1-frame"):
                ts = []
                for k in range(100, 140):
                    sync()
                    t0 = time.perf_counter()
                    if mode.startswith("stateful"):
                        n = 1 if "1-frame" in mode else 12
                        model.decode([DecodeWork(slot=0, frames=[codes[k : k + n]], n_frames=n, final=False)])
                    else:
                        t = torch.from_numpy(codes[: k + 1]).T[None].to(device)
                        codec.decode_windowed(t, 1, 72)
                    sync()
                    ts.append(time.perf_counter() - t0)
                out[f"codec-0.6b-bf16-{mode}-ms"] = 1e3 * float(np.median(ts))
            model.close_slot(0)
        del model
        torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu_qwen3_out")
    ap.add_argument("--oracle-site", default=None, help="folder holding the installed oracle wheels")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--sections", default="parity,streaming,speed")
    ap.add_argument("--codec-sizes", default="tiny,0.6b", help="codecs for the streaming section")
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    results: dict[str, Any] = {
        "env": {
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "python": sys.version.split()[0],
            "tf32": False,
        }
    }
    wanted = set(args.sections.split(","))
    if "parity" in wanted:
        if args.oracle_site:
            work = Path(tempfile.mkdtemp(prefix="qwen3-oracle-"))  # checkpoints stay out of --out
            section(results, "parity", lambda: parity(args.oracle_site, args.device, work))
        else:
            results["parity"] = {"skipped": "no --oracle-site"}
    if "streaming" in wanted:
        section(results, "streaming", lambda: streaming(args.device, args.codec_sizes.split(",")))
    if "speed" in wanted:
        section(results, "speed", lambda: speed(args.device))
    (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    verdict = {
        "fp32_parity_pass": results.get("parity", {}).get("fp32_parity_pass"),
        "fp32_streaming_pass": results.get("streaming", {}).get("fp32_pass"),
    }
    print("VERDICT", json.dumps(verdict), flush=True)


if __name__ == "__main__":
    main()
