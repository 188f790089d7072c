"""Voice cloning in bf16 against fp32 on the GPU, at the real Base shapes (random weights).

The CPU parity tests pin fp32 to the official package; this reports what serving in bf16 costs in
accuracy, and what deriving a voice profile costs in time (the reason profiles are cached):

- the speaker embedding (x-vector): relative error of bf16 against fp32;
- the reference codes of the speech tokenizer's encoder: the share of codes equal to fp32's;
- the time to derive a profile from a 5 s clip (x-vector, and x-vector + reference codes).

    python benchmarks/clone_precision.py --size 1.7b --device cuda --out clone_precision.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path

import numpy as np
import torch

from voicewire.engine.qwen3.presets import preset
from voicewire.engine.qwen3.voice_clone import VoiceCloner

REF_RATE_HZ = 24_000


def reference_clip(seconds: float, seed: int) -> np.ndarray:
    """A chirp with vibrato over a loudness contour plus noise (no speech is available here)."""
    t = np.arange(round(seconds * REF_RATE_HZ)) / REF_RATE_HZ
    rng = np.random.default_rng(seed)
    f0 = 120.0 + 80.0 * t / seconds + 10.0 * np.sin(2 * np.pi * 5.0 * t)
    phase = 2 * np.pi * np.cumsum(f0) / REF_RATE_HZ
    voice = sum(np.sin(k * phase) / k for k in range(1, 8))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 1.5 * t) ** 2
    pcm = 0.3 * envelope * voice + 0.02 * rng.standard_normal(t.size)
    return np.clip(pcm, -1, 1).astype(np.float32)


def _timed_ms(fn: object, reps: int, device: str) -> float:
    times = []
    for _ in range(reps):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1000)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size", default="1.7b", choices=("tiny-base", "0.6b", "1.7b"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--clips", type=int, default=4)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="clone_precision.json")
    args = ap.parse_args()
    if args.device.startswith("cuda"):  # fp32 means fp32: no TF32 in the reference side
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    cfg = preset(args.size, model_type="base") if args.size != "tiny-base" else preset("tiny-base")
    fp32 = VoiceCloner.random(cfg, seed=0, device=args.device, dtype=torch.float32)
    bf16 = VoiceCloner.random(cfg, seed=0, device=args.device, dtype=torch.bfloat16)
    rows = []
    for i in range(args.clips):
        clip = reference_clip(args.seconds, seed=100 + i)
        a = fp32.profile(clip, REF_RATE_HZ, "The reference transcript of this clip.")
        b = bf16.profile(clip, REF_RATE_HZ, "The reference transcript of this clip.")
        ea, eb = a.speaker_embedding.float(), b.speaker_embedding.float()
        rel = float((ea - eb).norm() / ea.norm())
        assert a.ref_codes is not None and b.ref_codes is not None
        same = float((a.ref_codes == b.ref_codes).float().mean())
        first_cb = float((a.ref_codes[:, 0] == b.ref_codes[:, 0]).float().mean())
        rows.append(
            {
                "clip": i,
                "xvector_rel_err": round(rel, 5),
                "codes_equal": round(same, 4),
                "codebook0_equal": round(first_cb, 4),
                "frames": int(a.ref_codes.shape[0]),
            }
        )
        print(rows[-1], flush=True)
    clip = reference_clip(args.seconds, seed=100)
    timing = {}
    for name, cloner in (("fp32", fp32), ("bf16", bf16)):
        cloner.profile(clip, REF_RATE_HZ, "warm up")
        timing[name] = {
            "xvector_ms": round(
                _timed_ms(lambda c=cloner: c.profile(clip, REF_RATE_HZ), args.reps, args.device), 2
            ),
            "xvector_and_codes_ms": round(
                _timed_ms(lambda c=cloner: c.profile(clip, REF_RATE_HZ, "text"), args.reps, args.device), 2
            ),
        }
    print(timing, flush=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    out = {
        "command": f"python benchmarks/clone_precision.py --size {args.size} --device {args.device} "
        f"--seconds {args.seconds} --clips {args.clips} --reps {args.reps}",
        "commit": commit or "unknown",
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": {
            "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "platform": platform.platform(),
        },
        "size": args.size,
        "clip_seconds": args.seconds,
        "bf16_vs_fp32": rows,
        "profile_time_ms": timing,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
