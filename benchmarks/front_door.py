"""Through the front door: `voicewire serve` started as the README says, driven by `voicewire probe`
in another process (open-loop Poisson arrivals, one WebSocket session per turn), at each rate of a
sweep: whole replies (one text.delta), then replies streamed as an LLM would (``--words-rates``,
``--tokens-per-s`` words a second), then HTTP speech requests as the Nari Labs ``tts_bench`` harness
sends them (``--http-rates``: benchmarks/tts_bench_compat.py's open loop); then the engine alone at the same rates
(benchmarks/serving_bench.py), in the same run, so the two can be compared. ``--plot`` draws p95
time to first audio and the late turns of each sweep against the rate.

    python benchmarks/front_door.py --rates 1,20,40,80 --words-rates 1,80 --out front_door.json \\
        --plot front_door.png -- --model qwen3-tts --qwen-size 1.7b --device cuda --random-weights

Everything after ``--`` goes to `voicewire serve` unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from voicewire.realtime.client.probe_report import summarize

PORT = 18940
# The load comes from this many loopback addresses: traffic of many users, as the server's
# per-client quotas (a quarter of the sessions each, a fair share of the streams) expect it.
CLIENTS = 64


def _stop(server: subprocess.Popen[bytes]) -> None:
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(60)
    except subprocess.TimeoutExpired:
        server.kill()


def _keep_log(log: Path, to: Path) -> None:
    """The server's log beside the results, less its access lines (one per request: thousands a
    point): its start-up phases and its warnings say what the figures alone do not."""
    with open(log, errors="replace") as src, open(to, "w") as dst:
        dst.writelines(line for line in src if "aiohttp.access" not in line)


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
    ap.add_argument("--words-rates", default="", help="rates of the sweep with streamed words ('' to skip)")
    ap.add_argument("--tokens-per-s", type=float, default=30.0, help="words a second of that sweep")
    ap.add_argument("--http-rates", default="", help="rates of the HTTP speech sweep ('' to skip)")
    ap.add_argument(
        "--barge-in", type=float, default=0.2, help="the share of that sweep's turns cut 0.3-1.5 s into their audio"
    )
    ap.add_argument(
        "--words-first",
        action="store_true",
        help="the words sweep before the whole replies: its first rate is then the first load of a just-ready server",
    )
    ap.add_argument(
        "--rates-again",
        default="",
        help="whole replies once more after the other sweeps (is a server slower after a words load?)",
    )
    ap.add_argument(
        "--words-one-proc",
        default="",
        help="the words sweep once more from one probe process (--procs 1), as every run measured before the "
        "probe spread its load: how much of a late turn was the client's",
    )
    ap.add_argument("--plot", default="", help="PNG of the sweeps ('' for none)")
    ap.add_argument("--duration-s", type=float, default=10.0)
    ap.add_argument("--ready-timeout-s", type=float, default=300.0)
    ap.add_argument(
        "--prestart",
        action="store_true",
        help="start the server once to /readyz and stop it before the measured start: on a fresh machine "
        "the first server did worse under load than later ones, so an A/B of two servers needs both later",
    )
    ap.add_argument("--engine-only", default="--size 1.7b", help="serving_bench.py args ('' to skip)")
    ap.add_argument("--workdir", default="/tmp/front_door")
    ap.add_argument("--out", default="front_door.json")
    args = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    rates = _points(args.rates, args.duration_s)
    base = f"http://127.0.0.1:{PORT}"
    serve_cmd = [sys.executable, "-m", "voicewire.realtime.cli", "serve", "--port", str(PORT), *serve_args]
    out: dict[str, Any] = {"serve_command": " ".join(["voicewire serve", "--port", str(PORT), *serve_args])}

    def save() -> None:  # after every sweep point: a run stopped by its time limit keeps what it measured
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")

    if args.prestart:
        with open(work / "prestart.log", "w") as log:
            server = subprocess.Popen(serve_cmd, stdout=log, stderr=subprocess.STDOUT)
            try:
                out["prestart_ready_s"] = round(_ready(base, args.ready_timeout_s), 1)
            finally:
                _stop(server)
        print(f"[front door] a first start, stopped once ready after {out['prestart_ready_s']} s", flush=True)
    with open(work / "serve.log", "w") as log:
        server = subprocess.Popen(serve_cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            out["ready_s"] = round(_ready(base, args.ready_timeout_s), 1)
            with urllib.request.urlopen(f"{base}/healthz", timeout=5) as r:
                out["healthz"] = json.loads(r.read())
            print(f"[front door] ready after {out['ready_s']} s: {out['healthz']}", flush=True)
            sweeps = [("gateway", rates, ["--whole"])]
            if args.words_rates:
                words = _points(args.words_rates, args.duration_s)
                sweeps.append(
                    ("gateway_words", words, ["--tokens-per-s", str(args.tokens_per_s), "--barge-in", str(args.barge_in)])
                )
            if args.words_first:
                sweeps.reverse()
            if args.rates_again:
                sweeps.append(("gateway_again", _points(args.rates_again, args.duration_s), ["--whole"]))
            if args.words_one_proc:
                sweeps.append(
                    (
                        "gateway_words_one_proc",
                        _points(args.words_one_proc, args.duration_s),
                        ["--tokens-per-s", str(args.tokens_per_s), "--barge-in", str(args.barge_in), "--procs", "1"],
                    )
                )
            for key, points, text_args in sweeps:
                out[key] = []
                for rate, secs, seed in points:
                    res = work / f"{key}_{rate:g}_{seed}.json"
                    out[key].append(_probe(base, rate, secs, [*text_args, "--seed", str(seed)], res))
                    save()
            if args.http_rates:
                out["http"] = []
                for rate, secs, seed in _points(args.http_rates, args.duration_s):
                    out["http"].append(_http(base, rate, secs, seed, work / f"http_{rate:g}_{seed}.json"))
                    save()
        finally:
            _stop(server)
            _keep_log(work / "serve.log", Path(args.out).with_suffix(".serve.log"))
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
    save()
    if args.plot:
        plot(out, args.plot)


def _points(spec: str, duration_s: float) -> list[tuple[float, float, int]]:
    """A sweep's points from "RATE[:SECONDS],...": each rate with its own duration where given (a
    low rate needs longer for a p95), and a seed per repeat of a rate, so that "400,400,400" is
    three Poisson draws rather than one draw three times."""
    points: list[tuple[float, float, int]] = []
    for item in spec.split(","):
        rate, _, secs = item.partition(":")
        r = float(rate)
        points.append((r, float(secs) if secs else duration_s, sum(p[0] == r for p in points)))
    return points


def _metrics(base: str) -> str:
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as r:
        return str(r.read().decode())


def _engine_counters(text: str) -> dict[str, float]:
    """The engine cores' counters on /metrics (summed over replicas): steps, frames, the worker's
    seconds in frame steps, codec waits and stream commands."""
    out: dict[str, float] = {}
    for m in re.finditer(r"^voicewire_engine_(\w+)_total\{[^}]*\} (\S+)$", text, re.M):
        out[m[1]] = round(out.get(m[1], 0.0) + float(m[2]), 3)
    return out


def _gauge_max(text: str, name: str) -> float:
    """A gauge's largest value over its series (replicas)."""
    found = re.findall(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)
    return round(max(map(float, found), default=0.0), 4)


def _gateways(base: str) -> dict[str, dict[str, float]]:
    """Each gateway process's own holds since ready (its loop late, its collections), and its loop's
    stalls and CPU seconds so far, by pid: with several on the port (``serve --workers``) whichever
    answers gives each one's with a ``pid`` label; one alone gives its own unlabelled."""
    text = _metrics(base)
    samples = {(m[1], m[2] or ""): float(m[3]) for m in re.finditer(r"^(\w+)(\{[^}]*\})? (\S+)$", text, re.M)}
    names = {
        "loop_lag_max_since_ready_seconds": "voicewire_gateway_loop_lag_max_since_ready_seconds",
        "loop_stalls": "voicewire_gateway_loop_stalls_total",
        "cpu_s": "process_cpu_seconds_total",
        "gc_pause_max_since_ready_seconds": "voicewire_gateway_gc_pause_max_since_ready_seconds",
    }
    return {
        pid: {k: samples.get((n, f'{{pid="{pid}"}}'), samples.get((n, ""), 0.0)) for k, n in names.items()}
        for pid in re.findall(r'^voicewire_gateway_process\{pid="(\d+)"\} ', text, re.M)
    }


def _gateway_point(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], wall_s: float) -> dict[str, Any]:
    """The gateway processes over one point: their loops' stalls and CPU seconds in it (summed), the
    busiest one's share of a core, and the longest hold of any since ready."""
    cpu = {pid: a["cpu_s"] - before.get(pid, {}).get("cpu_s", 0.0) for pid, a in after.items()}
    return {
        "processes": len(after),
        "loop_stalls": round(sum(a["loop_stalls"] - before.get(pid, {}).get("loop_stalls", 0.0) for pid, a in after.items())),
        "cpu_s": round(sum(cpu.values()), 2),
        # of one core, over the client's whole run (its start and the turns' drain included)
        "cpu_share_max": round(max(cpu.values(), default=0.0) / wall_s, 3),
        "loop_lag_max_since_ready_seconds": max(a["loop_lag_max_since_ready_seconds"] for a in after.values()),
        "gc_pause_max_since_ready_seconds": max(a["gc_pause_max_since_ready_seconds"] for a in after.values()),
    }


def _probe(base: str, rate: float, duration_s: float, text_args: list[str], res: Path) -> dict[str, Any]:
    cmd = [
        sys.executable, "-m", "voicewire.realtime.cli", "probe", "--url", base, "--rate", str(rate),
        "--duration", str(duration_s), "--session-per-turn", "--clients", str(CLIENTS), *text_args, "--out", str(res), "--plot", "",
    ]  # fmt: skip
    return _sweep_point(base, rate, cmd, ["voicewire", *cmd[3:]], duration_s + 120, res, " ".join(text_args))


def _http(base: str, rate: float, duration_s: float, seed: int, res: Path) -> dict[str, Any]:
    cmd = [
        sys.executable, "-m", "benchmarks.tts_bench_compat", "--base-url", base, "--rate", str(rate),
        "--duration-s", str(duration_s), "--clients", str(CLIENTS), "--seed", str(seed), "--out", str(res),
    ]  # fmt: skip
    return _sweep_point(base, rate, cmd, ["python", *cmd[1:]], duration_s + 180, res, "http")


def _sweep_point(
    base: str, rate: float, cmd: list[str], shown: list[str], timeout_s: float, res: Path, label: str
) -> dict[str, Any]:
    """One load client's run to completion: its summary, and what the engine did meanwhile (the
    worker's time in steps, codec and commands)."""
    before, gateway_before = _engine_counters(_metrics(base)), _gateways(base)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    row: dict[str, Any] = {"rate": rate, "command": " ".join(shown), "rc": proc.returncode}
    if res.exists():
        full = json.loads(res.read_text())
        row["result"] = full.get("summary")
        if full.get("turns"):
            row["late_turns"] = late_digest(full["turns"])
    else:
        row["stderr"] = proc.stderr[-2000:]
    text = _metrics(base)
    row["engine"] = {k: round(v - before.get(k, 0.0), 3) for k, v in _engine_counters(text).items()}
    row["engine"]["gc_pause_max_since_ready_seconds"] = _gauge_max(
        text, "voicewire_engine_gc_pause_max_since_ready_seconds"
    )
    row["gateway"] = _gateway_point(gateway_before, _gateways(base), time.perf_counter() - t0)
    print(f"[{label} {rate:g}/s] {json.dumps(row.get('result') or row)[:600]}", flush=True)
    return row


def late_digest(turns: list[dict[str, Any]]) -> dict[str, Any]:
    """What the late turns of a point had in common, kept in the JSON (the probe's per-turn file stays
    on the machine that ran it): whether they were cut, how long their stalls were, and in which
    second of the load they started (clustered: a pause; spread: a rate the engine cannot hold)."""
    late = [t for t in turns if t.get("underruns")]
    return {
        "late": len(late),
        "cut": sum(1 for t in late if t.get("cut_ms") is not None),
        "max_stall_ms": summarize([t.get("max_stall_ms", 0.0) for t in late]),
        "ttfb_ms": summarize([t["ttfb_ms"] for t in late if t.get("ttfb_ms") is not None]),
        "started_by_second": dict(sorted(Counter(int(t["t_start_s"]) for t in late).items())),
        # when the longest stall of each ended (WebSocket), and how many the gateway's own listener
        # saw too (audio handed to the transport late: the engine or the gateway's loop, not the wire
        # or the client)
        "stalled_by_second": dict(
            sorted(Counter(int(t["max_stall_at_s"]) for t in late if t.get("max_stall_at_s") is not None).items())
        ),
        "server_underran": sum(1 for t in late if (t.get("server") or {}).get("underruns")),
    }


def plot(out: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    for key, label in (
        ("gateway", "gateway, whole replies"),
        ("gateway_words", "gateway, words streamed"),
        ("gateway_again", "gateway, whole replies again"),
    ):
        rows = [r for r in out.get(key, []) if r.get("result")]
        if rows:
            x = [r["rate"] for r in rows]
            ax.plot(x, [r["result"]["ttfa_ms"]["p95"] for r in rows], "o-", label=label)
            bx.plot(
                x,
                [r["result"]["turns_with_underruns"] / max(1, r["result"]["turns"]) for r in rows],
                "o-",
                label=label,
            )
    http = [r for r in out.get("http", []) if r.get("result")]
    if http:
        x = [r["rate"] for r in http]
        ax.plot(x, [r["result"]["audible_ttfa_ms"]["p95"] for r in http], "^-", label="HTTP speech (audible TTFA)")
        bx.plot(x, [r["result"]["stalled"] / max(1, r["result"]["served"]) for r in http], "^-", label="HTTP speech")
    eng = (out.get("engine_only") or {}).get("open_loop") or []
    if eng:
        x = [r["rate"] for r in eng]
        ax.plot(x, [r["ttfp_ms_p95"] for r in eng], "s--", label="engine alone")
        bx.plot(
            x, [r["underrun_requests"] / max(1, r["completed"]) for r in eng], "s--", label="engine alone"
        )
    ax.set(xlabel="requests/s (Poisson)", ylabel="p95 time to first audio, ms", yscale="log")
    bx.set(xlabel="requests/s (Poisson)", ylabel="share of turns with an underrun")
    for a in (ax, bx):
        a.grid(alpha=0.3)
        a.legend()
    fig.suptitle(out.get("serve_command", ""), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
