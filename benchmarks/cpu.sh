#!/usr/bin/env bash
# CPU benchmarks of the gateway with the embedded voice, on this machine: the README's CPU tables.
#
#   benchmarks/cpu.sh [STEP...]         # every step (~25 min on 2 cores); or name some of them:
#     ws                   WebSocket TTFP (whole sentence, streamed words) and real-time capacity -> ws_cpu.json
#     webrtc               wire TTFA over WebRTC at 1 and 10 aiortc peers                -> webrtc_ttfa.json
#     probe                `voicewire probe` against `voicewire serve`, WebSocket (4 sessions) and
#                          WebRTC (2 sessions), an LLM at 30 words/s     -> probe_{ws,webrtc}_cpu.{json,png}
#     soak                 100 sessions for 5 min, 0.5-2 s pauses (overloads 2 cores) -> soak_cpu.json
#     soak-conversational  the same with 3-6 s pauses                   -> soak_cpu_conversational.json
#     words                the embedded voice's word timings vs onsets and faster-whisper -> word_timing_cpu.json
#     wer                  WER of 16 agent replies through `voicewire serve`: WebSocket whole, WebSocket a word
#                          a delta at 30/s, HTTP speech (Whisper tiny.en)               -> intelligibility_cpu.json
#     heap                 what a gateway process's full collection walks: tracked objects an open WebSocket
#                          session holds, a full collection at the load's peak (40 turns/s, paced null model)
#                                                                                   -> gateway_heap_cpu.json
#     queue                the same overload with the admission queue off and on (2 streams)  -> admission_queue_cpu.json
#     core                 the engine-core boundary per chunk, engine TTFP in process and through a core,
#                          10 WebRTC peers' packet gaps with the engine in and out of the gateway -> core_ipc_cpu.json
#     ray                  the same gateway with its core placed by Ray on a second local node against
#                          `voicewire serve` (its core on this host), alternating rounds -> ray_overhead_cpu.json
#     sim                  the engine around a simulated H200 (benchmarks/host_overhead.py --device h200: the
#                          measured graph times on the device queues), served, without a step queued ahead,
#                          with the served model's host time a call (host), and with 2 ms more a request's
#                          open (host-open2: the H200 profile's command time), at 150, 200 and 240 req/s
#                                                                                   -> h200_sim_cpu.json
#     ahead                the same simulation with the model's host time, a second frame step queued behind
#                          any step (min rows 0) against only behind steps of 64+ rows (the default), at 1,
#                          20, 80, 200 and 240 req/s                                -> queue_ahead_sim_cpu.json
#     host                 the real Qwen3-TTS host code with its device short-circuited (host_overhead.py
#                          --device qwen3), 320 turns at once, whole texts and a word a delta at 30/s;
#                          BASE=<git ref> alternates rounds with that commit's tree -> qwen3_host_cpu.json
#
# Files go to $OUT (default benchmarks/results, where the README's rows point), each with a "meta"
# object first (command, commit, machine, date: benchmarks/meta.sh). Each benchmark starts its own
# server (`probe` starts one `voicewire serve` for both transports and stops it by its pid). The
# machine should be otherwise idle: server and load generator share its cores, which is what the
# tables report. The full output: $LOG (default artifacts/cpu.log).
# PY and VOICEWIRE override the interpreter (.venv/bin/python) and the CLI (.venv/bin/voicewire).
set -o pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
STEPS=("$@")
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
LOG=${LOG:-artifacts/cpu.log}
mkdir -p "$(dirname "$LOG")"
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
VOICEWIRE=("${VOICEWIRE:-.venv/bin/voicewire}")
[ -x "${VOICEWIRE[0]}" ] || VOICEWIRE=("$PY" -m voicewire.realtime.cli)
PROBE_PORT=18931
declare -a STATUS=()
. benchmarks/meta.sh
meta_init "benchmarks/cpu.sh"
: >> "$LOG"
echo "[cpu] commit $VW_COMMIT, machine $VW_MACHINE" | tee -a "$LOG"

want() { [ ${#STEPS[@]} -eq 0 ] || [[ " ${STEPS[*]} " == *" $1 "* ]]; }

# step NAME MAX_S CMD...: CMD under `timeout MAX_S`, output to the log; sets CMD, RC, SECS.
step() {
  local name=$1 max=$2
  shift 2
  CMD="$*"
  echo "== $name (timeout $max s): $CMD" | tee -a "$LOG"
  local t0=$SECONDS
  timeout -k 10 "$max" "$@" 2>&1 | tee -a "$LOG" | tail -n 12
  RC=${PIPESTATUS[0]} SECS=$((SECONDS - t0))
  STATUS+=("$name: rc $RC, $SECS s$([ "$RC" = 124 ] && echo ", timed out")")
}

if want ws; then
  # every session comes from this one address, standing for many users: without the per-client
  # quota (a quarter of the sessions) the sweep past 64 sessions would be refused, not measured
  step ws 1500 "$PY" benchmarks/ws_bench.py --out "$OUT/ws_cpu.json" --turns 60 --sweep 25,50,75,100 \
    --serve-args "--max-sessions-per-client 0"
  stamp "$OUT/ws_cpu.json"
fi

if want ray; then
  step ray 900 "$PY" benchmarks/ray_overhead.py --out "$OUT/ray_overhead_cpu.json"
  stamp "$OUT/ray_overhead_cpu.json"
fi

if want words; then
  step words 600 "$PY" benchmarks/word_timing.py --out "$OUT/word_timing_cpu.json"
  stamp "$OUT/word_timing_cpu.json"
fi

if want wer; then
  step wer 600 "$PY" benchmarks/intelligibility.py --out "$OUT/intelligibility_cpu.json"
  stamp "$OUT/intelligibility_cpu.json"
fi

if want heap; then
  step heap 120 "$PY" benchmarks/gateway_heap.py --rate 40 --duration-s 10 --out "$OUT/gateway_heap_cpu.json"
  stamp "$OUT/gateway_heap_cpu.json"
fi

if want sim; then
  runs=()
  for v in served noahead host host-open2; do
    for r in 150 200 240; do
      case $v in
        noahead) flags=(--no-queue-ahead) ;;
        host) flags=(--host-work) ;;
        host-open2) flags=(--host-work --open-ms 2) ;;
        *) flags=() ;;
      esac
      step "sim-$v-$r" 200 "$PY" benchmarks/host_overhead.py --device h200 --rate "$r" --duration-s 6 \
        "${flags[@]}" --out "/tmp/sim_${v}_$r.json"
      runs+=("$CMD")
    done
  done
  "$PY" - "$OUT/h200_sim_cpu.json" << 'EOF'
import json, sys
out = {"what": "the engine (this CPU) around a simulated H200: host_overhead.py --device h200, per variant and rate",
       "variants": {}}
for v in ("served", "noahead", "host", "host-open2"):
    for r in (150, 200, 240):
        try:
            d = json.load(open(f"/tmp/sim_{v}_{r}.json"))
        except (OSError, ValueError) as err:
            d = {"error": repr(err)}
        out["variants"].setdefault(v, {})[str(r)] = d
json.dump(out, open(sys.argv[1], "w"), indent=1)
EOF
  CMD=$(printf '%s; ' "${runs[@]}") CMD=${CMD%; }
  stamp "$OUT/h200_sim_cpu.json"
fi

if want ahead; then
  runs=()
  for m in 0 64; do
    for r in 1 20 80 200 240; do
      secs=$([ "$r" -le 20 ] && echo 15 || echo 8)  # enough turns at the low rates for a p95
      step "ahead-$m-$r" 200 "$PY" benchmarks/host_overhead.py --device h200 --host-work --rate "$r" \
        --duration-s "$secs" --queue-ahead-min-rows "$m" --out "/tmp/ahead_${m}_$r.json"
      runs+=("$CMD")
    done
  done
  "$PY" - "$OUT/queue_ahead_sim_cpu.json" << 'EOF'
import json, sys
out = {"what": "the engine (this CPU) around a simulated H200 with the model's host time: a second frame step "
               "queued behind any step (queue_ahead_min_rows 0) or only behind steps of 64+ rows, per rate",
       "variants": {}}
for m in (0, 64):
    for r in (1, 20, 80, 200, 240):
        try:
            d = json.load(open(f"/tmp/ahead_{m}_{r}.json"))
            d.pop("worker_top", None), d.pop("worker_top_cumulative", None)
            d["load"].pop("stalls", None)
        except (OSError, ValueError, KeyError) as err:
            d = {"error": repr(err)}
        out["variants"].setdefault(f"min_rows_{m}", {})[str(r)] = d
json.dump(out, open(sys.argv[1], "w"), indent=1)
EOF
  CMD=$(printf '%s; ' "${runs[@]}") CMD=${CMD%; }
  stamp "$OUT/queue_ahead_sim_cpu.json"
fi

if want host; then
  # BASE's tree is imported ahead of the installed one through a link tree, as on the device (gpu.sh)
  sides=(head)
  if [ -n "${BASE:-}" ]; then
    base_dir=$(mktemp -d /tmp/vwbase-XXXX)
    git worktree add -q --detach "$base_dir/tree" "$BASE"
    mkdir -p "$base_dir/vw/voicewire"
    for d in engine realtime kernels web; do ln -sfn "$base_dir/tree/$d" "$base_dir/vw/voicewire/$d"; done
    sides+=(base)
  fi
  runs=()
  for round in 1 2; do
    for side in "${sides[@]}"; do
      for v in whole words30; do
        flags=()
        [ $v = words30 ] && flags=(--words-per-s 30)
        root=. pypath=${PYTHONPATH:-}
        [ $side = base ] && root=$base_dir/tree pypath=$base_dir/vw
        step "host-$side-$v-$round" 300 env PYTHONPATH="$pypath" "$PY" "$root/benchmarks/host_overhead.py" \
          --device qwen3 --concurrency 320 --duration-s 8 "${flags[@]}" --out "/tmp/host_${side}_${v}_$round.json"
        runs+=("$CMD")
      done
    done
  done
  HOST_BASE=$(git rev-parse --short "${BASE:-HEAD}") "$PY" - "$OUT/qwen3_host_cpu.json" << 'EOF'
import json, os, statistics, sys
out = {"what": "the Qwen3-TTS host code per step and per command, device short-circuited (host_overhead.py "
       "--device qwen3 --concurrency 320): medians of 2 alternating rounds; steps of 256 rows",
       "base": os.environ["HOST_BASE"], "variants": {}}


def med(xs):
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 3) if xs else None


for side in ("head", "base"):
    for v in ("whole", "words30"):
        runs = []
        for r in (1, 2):
            try:
                runs.append(json.load(open(f"/tmp/host_{side}_{v}_{r}.json")))
            except (OSError, ValueError):
                pass
        if not runs:
            continue
        full = [next((b for k, b in d["step_ms_by_rows"].items() if k.startswith("256")), {}) for d in runs]
        out["variants"].setdefault(v, {})[side] = {
            "ms_per_step_256": med([b.get("ms_per_step") for b in full]),
            "ms_per_step_256_less_commands": med([b.get("ms_per_step_less_commands") for b in full]),
            "cpu_ms_per_step_256": med([b.get("cpu_ms_per_step") for b in full]),
            "us_per_command": med([d["us_per_command"] for d in runs]),
            "frames_per_s": med([d["frames_per_s"] for d in runs]),
            "runs": [{k: d[k] for k in ("step_ms_by_rows", "us_per_command", "frames_per_s", "rows_per_step")} for d in runs],
        }
json.dump(out, open(sys.argv[1], "w"), indent=1)
print(json.dumps({v: {s: {k: x for k, x in f.items() if k != "runs"} for s, f in d.items()} for v, d in out["variants"].items()}))
EOF
  CMD=$(printf '%s; ' "${runs[@]}") CMD=${CMD%; }
  stamp "$OUT/qwen3_host_cpu.json"
  if [ -n "${BASE:-}" ]; then git worktree remove --force "$base_dir/tree"; rm -rf "$base_dir"; fi
fi

if want queue; then
  step queue 300 "$PY" benchmarks/admission_queue.py --out "$OUT/admission_queue_cpu.json"
  stamp "$OUT/admission_queue_cpu.json"
fi

if want core; then
  step core 1200 "$PY" benchmarks/core_ipc_bench.py --out "$OUT/core_ipc_cpu.json"
  stamp "$OUT/core_ipc_cpu.json"
fi

if want webrtc; then
  step webrtc 900 "$PY" benchmarks/webrtc_ttfa.py --server-log /tmp/webrtc_ttfa_server.log --out "$OUT/webrtc_ttfa.json"
  stamp "$OUT/webrtc_ttfa.json"
fi

if want probe; then
  "${VOICEWIRE[@]}" serve --port "$PROBE_PORT" > /tmp/probe_server.log 2>&1 &
  server=$!
  trap 'kill "$server" 2> /dev/null' EXIT
  if "$PY" - "$PROBE_PORT" << 'EOF'
import sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/readyz"
for _ in range(240):
    try:
        urllib.request.urlopen(url, timeout=2)
        sys.exit(0)
    except Exception:  # noqa: BLE001 - not up or not ready yet
        time.sleep(0.5)
sys.exit("server not ready after 120 s")
EOF
  then
    for transport in ws webrtc; do
      sessions=4
      [ $transport = webrtc ] && sessions=2
      step "probe-$transport" 180 "${VOICEWIRE[@]}" probe --url "http://127.0.0.1:$PROBE_PORT" --duration 30 \
        --concurrency $sessions --tokens-per-s 30 --transport $transport \
        --out "$OUT/probe_${transport}_cpu.json" --plot "$OUT/probe_${transport}_cpu.png"
      stamp "$OUT/probe_${transport}_cpu.json"
    done
  else
    STATUS+=("probe: not run, the server was not ready (/tmp/probe_server.log)")
  fi
  kill "$server" 2> /dev/null
  wait "$server" 2> /dev/null
  trap - EXIT
fi

if want soak; then
  step soak 420 "$PY" benchmarks/soak.py --sessions 100 --duration 300 --out "$OUT/soak_cpu.json"
  stamp "$OUT/soak_cpu.json"
fi

if want soak-conversational; then
  step soak-conversational 420 "$PY" benchmarks/soak.py --sessions 100 --duration 300 --user-turn-s 3,6 \
    --out "$OUT/soak_cpu_conversational.json"
  stamp "$OUT/soak_cpu_conversational.json"
fi

echo "== summary: benchmarks/cpu.sh ${STEPS[*]} (commit $VW_COMMIT, $SECONDS s)" | tee -a "$LOG"
printf '  %s\n' "${STATUS[@]}" | tee -a "$LOG"
