"""Start-up: seconds from `voicewire serve` to /readyz 200, for a first start with an empty compile
cache and the starts after it, and where each start's time went (the phase lines of its log).

    python benchmarks/startup.py --starts 2 --out startup.json -- --model qwen3-tts --qwen-size 1.7b \\
        --device cuda --random-weights

Each start gets the same --cache-dir (a fresh directory unless one is given), so the first start
compiles and the second shows what the cache saves. Run on the device by `benchmarks/gpu.sh startup`.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

PORT = 18941
# log lines that say where start-up time goes (engine/qwen3, engine/compile_cache.py, cuda_graphs.py)
PHASES = re.compile(r"compile cache|built in|graphs in|max_slots auto|warm|ready|qwen3-tts|KV", re.I)


def start_once(serve_args: list[str], cache_dir: str, log_path: Path, timeout_s: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "voicewire.realtime.cli", "serve", "--port", str(PORT), *serve_args]
    cmd += ["--cache-dir", cache_dir]
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        ready_s = None
        try:
            while time.monotonic() - t0 < timeout_s and server.poll() is None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/readyz", timeout=1) as r:
                        if r.status == 200:
                            ready_s = time.monotonic() - t0
                            break
                except OSError:
                    pass
                time.sleep(0.2)
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                server.kill()
    lines = [
        ln.strip()
        for ln in log_path.read_text(errors="replace").splitlines()
        if PHASES.search(ln) and "aiohttp.access" not in ln
    ]
    return {
        "ready_s": None if ready_s is None else round(ready_s, 1),
        "rc": server.returncode,
        # what this start left for the next: compiled kernels by library
        "cache_files_after": {
            d.name: sum(1 for f in d.rglob("*") if f.is_file())
            for d in sorted(Path(cache_dir).iterdir())
            if d.is_dir()
        },
        "log": lines[-40:],
    }


def main() -> None:
    argv = sys.argv[1:]
    serve_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--starts", type=int, default=2)
    ap.add_argument("--cache-dir", default="", help="'' = a fresh directory, removed after")
    ap.add_argument("--ready-timeout-s", type=float, default=300.0)
    ap.add_argument("--workdir", default="/tmp/startup")
    ap.add_argument("--out", default="startup.json")
    args = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    cache = args.cache_dir or tempfile.mkdtemp(prefix="voicewire-cache-")
    out: dict[str, Any] = {
        "serve_command": " ".join(["voicewire serve", *serve_args]),
        "cache_dir": "a fresh directory" if not args.cache_dir else cache,
        "starts": [],
    }
    try:
        for i in range(args.starts):
            res = start_once(serve_args, cache, work / f"start_{i}.log", args.ready_timeout_s)
            out["starts"].append(res)
            print(f"[startup] start {i}: ready after {res['ready_s']} s", flush=True)
            Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    finally:
        if not args.cache_dir:
            shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
