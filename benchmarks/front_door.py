"""Through the front door: `voicewire serve` started as the README says, driven by `voicewire probe`
in another process (open-loop Poisson arrivals, one WebSocket session per turn, whole replies), at
each rate of a sweep; then the engine alone at the same rates (benchmarks/serving_bench.py), in the
same run, so the two can be compared.

    python benchmarks/front_door.py --rates 1,20,40,80 --out front_door.json -- \\
        --model qwen3-tts --qwen-size 1.7b --device cuda --random-weights

Everything after ``--`` goes to `voicewire serve` unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

PORT = 18940


def _ready(base: str, timeout_s: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            with urllib.request.urlopen(f"{base}/readyz", timeout=1) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server was not ready within {timeout_s:.0f} s")


def main() -> None:
    argv = sys.argv[1:]
    serve_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rates", default="1,20,40,80")
    ap.add_argument("--duration-s", type=float, default=10.0)
    ap.add_argument("--ready-timeout-s", type=float, default=300.0)
    ap.add_argument("--engine-only", default="--size 1.7b", help="serving_bench.py args ('' to skip)")
    ap.add_argument("--workdir", default="/tmp/front_door")
    ap.add_argument("--out", default="front_door.json")
    args = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    rates = [float(r) for r in args.rates.split(",")]
    base = f"http://127.0.0.1:{PORT}"
    serve_cmd = [sys.executable, "-m", "voicewire.realtime.cli", "serve", "--port", str(PORT), *serve_args]
    out: dict[str, Any] = {"serve_command": " ".join(["voicewire serve", "--port", str(PORT), *serve_args])}
    with open(work / "serve.log", "w") as log:
        server = subprocess.Popen(serve_cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            out["ready_s"] = round(_ready(base, args.ready_timeout_s), 1)
            with urllib.request.urlopen(f"{base}/healthz", timeout=5) as r:
                out["healthz"] = json.loads(r.read())
            print(f"[front door] ready after {out['ready_s']} s: {out['healthz']}", flush=True)
            out["gateway"] = []
            for rate in rates:
                res = work / f"probe_{rate:g}.json"
                cmd = [
                    sys.executable, "-m", "voicewire.realtime.cli", "probe", "--url", base,
                    "--rate", str(rate), "--duration", str(args.duration_s), "--session-per-turn",
                    "--whole", "--out", str(res), "--plot", "",
                ]  # fmt: skip
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.duration_s + 120)
                row: dict[str, Any] = {
                    "rate": rate,
                    "command": " ".join(["voicewire", *cmd[3:]]),
                    "rc": proc.returncode,
                }
                if res.exists():
                    row["result"] = json.loads(res.read_text()).get("summary")
                else:
                    row["stderr"] = proc.stderr[-2000:]
                out["gateway"].append(row)
                print(f"[gateway {rate:g}/s] {json.dumps(row.get('result') or row)[:600]}", flush=True)
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                server.kill()
    if args.engine_only:
        eng = work / "engine_only.json"
        cmd = [
            sys.executable, "benchmarks/serving_bench.py", *args.engine_only.split(), "--sections", "serve",
            "--rates", args.rates, "--rate-duration-s", str(args.duration_s), "--concurrency", "",
            "--out", str(eng),
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=os.environ.copy())
        out["engine_only"] = {"command": " ".join(cmd[1:]), "rc": proc.returncode}
        if eng.exists():
            out["engine_only"]["open_loop"] = json.loads(eng.read_text()).get("serve", {}).get("open_loop")
        else:
            out["engine_only"]["stderr"] = proc.stderr[-3000:]
        print(f"[engine only] rc {proc.returncode}", flush=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
