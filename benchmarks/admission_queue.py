"""What waiting for a free stream does, against refusing at once: the same open-loop load on an
engine too small for it, with the admission queue off (``--queue-wait-ms 0``) and on.

`voicewire serve` with the embedded voice and ``--max-streams N`` (few streams, so a CPU reaches
the limit), driven by `voicewire probe --rate R --session-per-turn` in another process (replies
streamed as an LLM would); per wait: turns, refused turns, TTFB and late (underrun) turns.

    python benchmarks/admission_queue.py --out benchmarks/results/admission_queue_cpu.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ws_bench import start_server, write_results


def probe(port: int, rate: float, duration_s: float, out: Path) -> dict[str, Any]:
    cmd = [
        sys.executable, "-m", "voicewire.realtime.cli", "probe", "--url", f"http://127.0.0.1:{port}",
        "--rate", str(rate), "--duration", str(duration_s), "--session-per-turn", "--out", str(out),
        "--plot", "",
    ]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, timeout=duration_s + 120)
    summary: dict[str, Any] = json.loads(out.read_text())["summary"]
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results/admission_queue_cpu.json")
    ap.add_argument("--port", type=int, default=8783)
    ap.add_argument("--max-streams", type=int, default=2)
    ap.add_argument("--rate", type=float, default=6.0)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--waits-ms", default="0,500")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for wait_ms in (int(w) for w in args.waits_ms.split(",")):
            flags = ("--max-streams", str(args.max_streams), "--queue-wait-ms", str(wait_ms))
            server = start_server(args.port, extra=flags)
            try:
                s = probe(args.port, args.rate, args.duration, Path(tmp) / f"probe_{wait_ms}.json")
            finally:
                server.terminate()
                server.wait(20)
            row = {
                "queue_wait_ms": wait_ms,
                "turns": s["turns"],
                "completed": s["completed"],
                "refused": s["errors"].get("refused", 0),
                "errors": s["errors"],
                "ttfb_ms": s["ttfb_ms"],
                "turns_with_underruns": s["turns_with_underruns"],
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    write_results(
        {"what": "the same load with the admission queue off and on", "setup": vars(args), "rows": rows},
        args.out,
        note="server and probe share the machine's cores",
    )


if __name__ == "__main__":
    main()
