"""Ours next to the official qwen-tts, same GPU, same random weights, same lengths, one run.

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/oracle_site \\
        .whl/qwen3-oracle/*.whl
    python3 benchmarks/side_by_side.py --size 1.7b --oracle-site /tmp/oracle_site --workdir /tmp/sbs \\
        --out side_by_side.json -- --sections step,codec,single,serve --plot serving.png ...

1. our config files for the size (engine/qwen3/testing.py) go into ``workdir/ckpt``;
2. the official package (a subprocess with PYTHONPATH = the oracle site: transformers 4.57.3 for that
   process only) builds its model from them, randomizes and saves the weights there, and is timed
   (benchmarks/official_qwen_tts.py);
3. our serving benchmark (benchmarks/serving_bench.py, arguments after ``--``) loads the same
   directory;
4. the two JSONs are merged with the acceptance ratios: time per frame at batch 1, best aggregate
   throughput (decode only on both sides, the frame rate; and end to end, text to waveform, when
   the official run has ``--e2e-batch`` and ours ``--bursts``), time to first audio of a 10-s
   utterance.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run(cmd: list[str], env: dict[str, str], timeout_s: float, log: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    with log.open("w") as f:
        try:
            rc = subprocess.run(
                cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s
            ).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    return {"cmd": " ".join(cmd), "rc": rc, "seconds": round(time.perf_counter() - t0, 1)}


def load(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError) as err:
        return {"error": f"no result: {err!r}"}


def compare(official: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    dec = official.get("decode", {})
    graphs = ours.get("step", {}).get("variants", {})
    best_variant = min(
        (v for v in graphs.values() if "1" in v.get("batches", {})),
        key=lambda v: v["batches"]["1"]["generate_wall_ms_median"],
        default=None,
    )
    if "ms_per_frame" in dec.get("1", {}) and best_variant is not None:
        ours_ms = best_variant["batches"]["1"]["generate_wall_ms_median"]
        out["frame_time_b1"] = {
            "official_ms": dec["1"]["ms_per_frame"],
            "ours_ms_host_inclusive": ours_ms,
            "ours_gpu_ms": best_variant["batches"]["1"]["step_gpu_ms"],
            "ratio": dec["1"]["ms_per_frame"] / ours_ms,
            "target": ">= 30",
        }
    off_best = max((d.get("aggregate_x_realtime", 0.0) for d in dec.values()), default=0.0)
    closed = ours.get("serve", {}).get("closed_loop", [])
    ours_best = max((p.get("audio_s_per_s") or 0.0 for p in closed), default=0.0)
    step_best = 0.0
    if best_variant is not None:
        for b, row in best_variant.get("batches", {}).items():
            step_best = max(step_best, int(b) * 80.0 / row["generate_wall_ms_median"])
    out["best_aggregate_throughput_x_realtime"] = {
        "official_best_decode": off_best,
        "official_by_batch": {b: d.get("aggregate_x_realtime") for b, d in dec.items()},
        "ours_engine_closed_loop_best": ours_best,
        "ours_frame_step_best": step_best,
        "ratio_decode": step_best / off_best if off_best else None,
        "ratio_engine": ours_best / off_best if off_best else None,
        "target": ">= 10",
    }
    # end to end on both sides, text to waveform at the best batch: the official batched generate
    # (+ its code2wav) against our engine given the same number of requests at once (streaming)
    off_e2e = official.get("e2e_batched", {})
    bursts = (ours.get("serve", {}) or {}).get("burst", [])
    if "audio_s_per_s" in off_e2e and bursts:
        best = max(bursts, key=lambda r: r.get("audio_s_per_s") or 0.0)
        out["end_to_end_throughput_audio_s_per_s"] = {
            "official": off_e2e["audio_s_per_s"],
            "official_batch": off_e2e["batch"],
            "ours_burst_best": best["audio_s_per_s"],
            "ours_burst_requests": best["requests_at_once"],
            "ours_burst_ttfp_ms_p95": best["ttfp_ms_p95"],
            "ratio": best["audio_s_per_s"] / off_e2e["audio_s_per_s"],
            "target": ">= 10",
        }
    e2e = official.get("e2e_b1", {})
    single = (ours.get("serve", {}) or {}).get("single_10s") or {}
    if "s" in e2e and single.get("ttfp_ms_p50"):
        out["time_to_first_audio_10s"] = {
            "official_s": e2e["s"],
            "ours_ttfp_ms_p50": single["ttfp_ms_p50"],
            "ours_ttfp_ms_max": single.get("ttfp_ms_max"),
            "ratio": e2e["s"] * 1e3 / single["ttfp_ms_p50"],
            "official_rtf": e2e.get("rtf"),
            "ours_rtf_p50": single.get("rtf_p50"),
            "target": ">= 100",
        }
    return out


def main() -> None:
    argv = sys.argv[1:]
    bench_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1.7b")
    ap.add_argument("--oracle-site", required=True)
    ap.add_argument("--workdir", default="/tmp/side_by_side")
    ap.add_argument("--out", required=True)
    ap.add_argument("--official-args", default="", help="extra arguments for official_qwen_tts.py")
    ap.add_argument("--official-timeout-s", type=float, default=240)
    ap.add_argument("--ours-timeout-s", type=float, default=420)
    args = ap.parse_args(argv)

    from voicewire.engine.qwen3.presets import preset
    from voicewire.engine.qwen3.testing import write_config_files

    work = Path(args.workdir)
    ckpt = work / "ckpt"
    ckpt.mkdir(parents=True, exist_ok=True)
    write_config_files(preset(args.size), str(ckpt))
    res: dict[str, Any] = {"command": " ".join(sys.argv), "size": args.size, "runs": {}}

    env = dict(os.environ)
    env["PYTHONPATH"] = args.oracle_site
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "official_qwen_tts.py"),
        "--dir",
        str(ckpt),
        "--build",
        "--out",
        str(work / "official.json"),
        *args.official_args.split(),
    ]
    res["runs"]["official"] = run(cmd, env, args.official_timeout_s, work / "official.log")
    res["official"] = load(work / "official.json")
    print("official:", json.dumps(res["runs"]["official"]), flush=True)

    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "serving_bench.py"),
        "--checkpoint",
        str(ckpt),
        "--size",
        args.size,
        "--out",
        str(work / "ours.json"),
        *bench_args,
    ]
    res["runs"]["ours"] = run(cmd, env, args.ours_timeout_s, work / "ours.log")
    res["ours"] = load(work / "ours.json")
    print("ours:", json.dumps(res["runs"]["ours"]), flush=True)

    res["comparison"] = compare(res["official"], res["ours"])
    Path(args.out).write_text(json.dumps(res, indent=1, default=str))
    print(json.dumps(res["comparison"], indent=1))


if __name__ == "__main__":
    main()
