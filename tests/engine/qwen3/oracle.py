"""Driving the official qwen-tts oracle (oracle_run.py) from our side: the job, the environment, the run.

Shared by the parity tests and benchmarks/gpu_qwen3_check.py. The oracle environment is the folder
``oracle_setup.sh`` fills (default ``<repo>/.oracle``, or ``$VOICEWIRE_ORACLE_DIR``); on a machine
without it the parity tests skip, naming the setup command.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from voicewire.engine.model import StreamParams
from voicewire.engine.qwen3.presets import preset
from voicewire.engine.qwen3.testing import write_config_files

ROOT = Path(__file__).resolve().parents[3]
ORACLE_DIR = Path(os.environ.get("VOICEWIRE_ORACLE_DIR", str(ROOT / ".oracle")))
SETUP = "tests/engine/qwen3/oracle_setup.sh"

# (name, preset, seed, shard size, random-code frames, prompts). Prompt 2 runs 90 frames: past the
# codec's 72-frame window and past the end of its text (tts-eos, then tts-pad feeds). Prompt 3 uses a
# dialect speaker with "chinese" (the package swaps in the dialect id). Prompt 4 puts the whole text in
# the prompt (``non_streaming_mode=True``, the package's default for CustomVoice). "tiny" has the 1.7B-style
# projection into a narrower code predictor and is saved in shards; "tiny-base" is a Base model
# (speaker encoder tensors in the file, no speaker) with an equally wide code predictor (0.6B-style).
CHECKPOINTS: list[dict[str, Any]] = [
    {
        "name": "tiny",
        "preset": "tiny",
        "seed": 1,
        "max_shard_size": "4MB",
        "random_frames": 100,
        "prompts": [
            {"text": "Hello world, this is a test.", "speaker": "ryan", "language": "english", "frames": 20},
            {
                "text": "The quick brown fox jumps over the lazy dog while McDonald's iPhone rings.",
                "speaker": "vivian",
                "language": "auto",
                "frames": 90,
            },
            {
                "text": "Good morning! 12 apples cost $3.50.",
                "speaker": "eric",
                "language": "chinese",
                "frames": 30,
            },
            {
                "text": "The whole text in the prompt, the package's default.",
                "speaker": "serena",
                "language": "english",
                "frames": 25,
                "whole_text": True,
            },
        ],
    },
    {
        "name": "base",
        "preset": "tiny-base",
        "seed": 2,
        "max_shard_size": None,
        "random_frames": 0,
        "prompts": [{"text": "Base model speaks.", "speaker": None, "language": "english", "frames": 15}],
        "clone": {
            # reference clips (reference_audio): 3 s, a short 1 s one (the in-context text then runs
            # past the reference frames and trails into the decode steps), and one at 16 kHz (resampled)
            "refs": [
                {
                    "seconds": 3.0,
                    "rate_hz": 24_000,
                    "seed": 11,
                    "text": "Hello world, this is the reference.",
                },
                {"seconds": 1.0, "rate_hz": 24_000, "seed": 12, "text": "Good morning."},
                {"seconds": 2.0, "rate_hz": 16_000, "seed": 13, "text": "The lazy dog."},
            ],
            "cases": [
                {
                    "ref": 0,
                    "icl": False,
                    "text": "A cloned voice speaks.",
                    "language": "english",
                    "frames": 15,
                },
                {
                    "ref": 0,
                    "icl": True,
                    "text": "A cloned voice speaks.",
                    "language": "english",
                    "frames": 20,
                },
                {
                    "ref": 1,
                    "icl": True,
                    "text": "The quick brown fox jumps over the lazy dog while McDonald's iPhone rings.",
                    "language": "auto",
                    "frames": 40,
                },
                {
                    "ref": 0,
                    "icl": True,
                    "text": "The whole text in the prompt.",
                    "language": "english",
                    "frames": 12,
                    "whole_text": True,
                },
                {"ref": 2, "icl": False, "text": "Hello world.", "language": "english", "frames": 10},
            ],
        },
    },
]


def reference_audio(seconds: float, rate_hz: int, seed: int) -> np.ndarray:
    """A synthetic reference clip (S,) float32 in [-1, 1]: a chirp with a vibrato over a loudness
    contour, plus noise, so every mel band and codebook sees some energy (no speech available here)."""
    t = np.arange(round(seconds * rate_hz)) / rate_hz
    rng = np.random.default_rng(seed)
    f0 = 120.0 + 80.0 * t / seconds + 10.0 * np.sin(2 * np.pi * 5.0 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate_hz
    voiced = sum(np.sin(k * phase) / k for k in range(1, 8))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 1.5 * t) ** 2
    x = 0.3 * envelope * voiced + 0.05 * rng.standard_normal(t.size)
    return np.clip(x, -1.0, 1.0).astype(np.float32)


def greedy_params(prompt: dict[str, Any]) -> StreamParams:
    """Our stream parameters for one CHECKPOINTS prompt: greedy, its forced length, its voice."""
    return StreamParams(
        voice=prompt["speaker"] or "",
        language=prompt["language"],
        greedy=True,
        forced_frames=prompt["frames"],
        seed=0,
        extra={"whole_text": prompt.get("whole_text", False)},
    )


def oracle_ready(oracle_dir: Path = ORACLE_DIR) -> bool:
    return oracle_dir.is_dir() and any(p.name.startswith("READY-") for p in oracle_dir.iterdir())


def oracle_pythonpath(oracle_dir: Path = ORACLE_DIR, python: str = sys.executable) -> str:
    paths = [str(oracle_dir / "site")]
    has_torchaudio = subprocess.run([python, "-c", "import torchaudio"], capture_output=True).returncode == 0
    if not has_torchaudio:  # CPU torch here has no torchaudio build: the stub satisfies the import
        paths.append(str(oracle_dir / "stub"))
    return os.pathsep.join(paths)


@dataclass
class OracleRun:
    checkpoints: list[dict[str, Any]]  # the job's entries, with "dir" filled in
    ref: dict[str, np.ndarray]

    def directory(self, name: str) -> str:
        return next(str(c["dir"]) for c in self.checkpoints if c["name"] == name)


def run_oracle(
    workdir: Path,
    device: str = "cpu",
    dtype: str = "float32",
    oracle_dir: Path = ORACLE_DIR,
    python: str = sys.executable,
    timeout_s: float = 600.0,
    pythonpath: str | None = None,
    build: bool = True,
) -> OracleRun:
    """Write config skeletons, let the oracle fill in random weights and reference outputs, read them.

    ``build=False`` reuses the weights a previous run wrote in ``workdir`` (e.g. to run the oracle
    again in bf16 on the same fp32 weights). ``pythonpath`` overrides the oracle folder (a device
    machine installs the carried wheels elsewhere).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    checkpoints = []
    for c in CHECKPOINTS:
        d = workdir / c["name"]
        if build:
            write_config_files(preset(c["preset"]), str(d))
        entry = {**c, "dir": str(d), "build": build}
        if "clone" in c:  # the reference clips go to the oracle as files: the same samples both sides
            refs = []
            for j, r in enumerate(c["clone"]["refs"]):
                path = workdir / f"{c['name']}-ref{j}.npy"
                np.save(path, reference_audio(r["seconds"], r["rate_hz"], r["seed"]))
                refs.append({**r, "path": str(path)})
            entry["clone"] = {**c["clone"], "refs": refs}
        checkpoints.append(entry)
    job = {"device": device, "dtype": dtype, "threads": 2, "checkpoints": checkpoints}
    tag = f"{dtype}-{device.replace(':', '')}"
    job_path, out_path = workdir / f"job-{tag}.json", workdir / f"oracle-{tag}.npz"
    job_path.write_text(json.dumps(job))
    env = {
        **os.environ,
        "PYTHONPATH": pythonpath or oracle_pythonpath(oracle_dir, python),
        "TRANSFORMERS_VERBOSITY": "error",
    }
    env.pop("PYTHONHOME", None)
    script = Path(__file__).with_name("oracle_run.py")
    proc = subprocess.run(
        [python, str(script), str(job_path), str(out_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=str(workdir),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"oracle failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    with np.load(out_path) as z:
        ref = {k: z[k] for k in z.files}
    return OracleRun(checkpoints, ref)


def shared_run(folder: Path, device: str = "cpu") -> OracleRun:
    """One run for every process that asks for ``folder``: the first runs it under a lock, the others
    wait for it and read what it wrote (pytest-xdist's workers, and scripts/test's run ahead of them)."""
    from filelock import FileLock

    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{folder}.lock"):
        done = folder / "run.pickle"
        if done.exists():
            run: OracleRun = pickle.loads(done.read_bytes())
            return run
        run = run_oracle(folder, device=device)
        done.write_bytes(pickle.dumps(run))
        return run


if __name__ == "__main__":
    # scripts/test: the CPU run into $VOICEWIRE_ORACLE_RUN/oracle-cpu while the type check runs. Through
    # the module's own name, so the pickle names tests.engine.qwen3.oracle.OracleRun, not __main__'s.
    from tests.engine.qwen3.oracle import shared_run as run_shared

    run_shared(Path(sys.argv[1]) / "oracle-cpu")
