#!/usr/bin/env bash
# GPU benchmarks of the Qwen3-TTS engine on one lent H200, one mode per results table of the README.
# Run from the repository root, on the device (`run` tool; COMMIT names the tree, the copy there has no .git):
#
#   COMMIT=<sha> bash benchmarks/gpu.sh headline [STEP...]   # README "Qwen3-TTS on one H200" (~8 min)
#       serving    1.7B in-process engine: frame step at B = 1, 8, 32, 64, 128 (GPU / whole call; talker,
#                  code predictor, sampling), codec graphs, 10-s utterances one at a time, open-loop
#                  Poisson sweep 1-100 req/s, closed loop 64 / 128 clients   -> serving_h200.json, .png
#       step-0.6b  the 0.6B frame step at B = 1 and 64                       -> step_0.6b_h200.json
#       tests      every GPU test: tests/kernels, tests/engine/qwen3/test_gpu.py, and the codec's ragged
#                  calls on CUDA                                             -> gpu_tests_h200.json
#   COMMIT=<sha> bash benchmarks/gpu.sh kernels [STEP...]    # README kernel tables (~7 min)
#       attention  decode / sliding-window attention against SDPA          -> kernels_h200.json
#       linear     the fused decode linear against cuBLAS, 1 and 64 rows   -> linear_h200.json
#       gemv       the one-/two-row linears as the frame's PDL chains      -> gemv_h200.json
#       conv       the codec's k > 1 convs alone: cuDNN timed per shape / heuristic / kernels/conv1d.py
#                  (CONV_FLAGS: conv_bench.py's --shapes, --tiles)                -> conv_h200.json
#       codec      codec graphs and warm-up seconds, CODEC_VARIANTS (served cudnn; conv-kernel, kernel-heuristics,
#                  torch-ops)                                                -> codec_h200.json
#   COMMIT=<sha> bash benchmarks/gpu.sh throughput [STEP...] # README "Throughput levers" (~8 min)
#       levers     the engine alone (SIZE, default 1.7b), open loop past the knee, one build: the served engine
#                  against the same engine with each lever off (VARIANTS, RATES, MAX_BATCH, PREFILL_BATCH
#                  override)                                             -> throughput[_SIZE]_h200.json
#       tests      tests/engine/qwen3/test_gpu.py (overlapped decode and long chunks equal the serial
#                  audio; streaming equals offline for every chunk cadence; TESTS_K: pytest's -k
#                  expression, to run some of them)                              -> gpu_tests_qwen3_h200.json
#   COMMIT=<sha> bash benchmarks/gpu.sh front-door           # README "Through the front door" (~9 min)
#       `voicewire serve --model qwen3-tts --qwen-size SIZE --device cuda --random-weights SERVE_FLAGS`
#       (the README's command), probed from another process: open loop, a session per turn, whole
#       replies at RATES and words at 30/s at WORDS_RATES; then the engine alone at RATES, its
#       utterances scaled to the probe's (3.4 s mean)  -> front_door_SIZE[_TAG]_h200.json, .png, .serve.log
#       (.serve.log: the server's log less its access lines: start-up phases, warnings)
#       PRESTART=1: one start to /readyz and a stop before the measured server (on a fresh machine the
#       first server did worse under load than later ones: two servers of an A/B both come later)
#       needs the gateway's packages carried (.whl/site.tar.xz: benchmarks/device_site.sh); each half builds
#       and captures the model (~200 s), so ENGINE_ONLY='' (no engine-only half) leaves the call for the gateway
#       WORDS_FIRST=1: the words sweep first (its first rate the first load after ready)
#       RATES_AGAIN: whole replies again after the other sweeps (the same Poisson draws as RATES')
#       HTTP_RATES: then HTTP speech as the tts_bench harness sends it, open loop (tts_bench_compat.py)
#       WORDS_ONE_PROC: the words sweep once more from one probe process (--procs 1), as runs before
#       the probe spread its load over processes (one per 50 turns/s)
#       SERVE_FLAGS=--ray TAG=ray: the same with the core placed by Ray (a local cluster in-process; Ray
#       carried in .whl/site.tar.xz: benchmarks/device_site.sh)
#   COMMIT=<sha> bash benchmarks/gpu.sh gateways             # WebRTC peers (words at 20/s) that one
#       gateway process paces against `--workers 4`, one Qwen3-TTS core placed by Ray on the GPU
#       (benchmarks/gateway_workers.py; PEERS, WORKERS)               -> gateway_workers_SIZE_h200.json
#   COMMIT=<sha> bash benchmarks/gpu.sh startup              # start-up: the README's command to /readyz 200,
#       STARTS (default 2) starts on one fresh compile cache (CACHE_DIR: this one, kept for the modes after),
#       each start's phase lines                             -> startup_SIZE_h200.json
#   COMMIT=<sha> bash benchmarks/gpu.sh side-by-side         # README "against the official qwen-tts" (~6 min)
#       the official qwen-tts 0.1.1 and ours on the same saved random weights, one call
#                                                            -> side_by_side_h200.json, .png, official.log, ours.log
#   COMMIT=<sha> bash benchmarks/gpu.sh parity               # fp32 parity with qwen-tts on CUDA, bf16 deviations,
#                                                            # streaming == offline on CUDA -> parity_h200.json
#   COMMIT=<sha> bash benchmarks/gpu.sh clone                # voice cloning (Base): fp32 parity with qwen-tts on
#                                                            # CUDA, bf16 against fp32 at 1.7B shapes
#                                                            -> clone_parity_h200.json, clone_precision_h200.json
#   COMMIT=<sha> bash benchmarks/gpu.sh profile [STEP...]    # where the GPU and the worker's time goes
#       step       per-kernel profile of the captured frame step (VARIANTS: profile_step.py's, default fused;
#                  BATCHES, default 1,64; MAX_BATCH past 128 for larger ones) -> profile[_TAG]_h200.json
#       serve      the served 1.7B engine under open-loop load (RATES, VARIANTS, SECTIONS, PROFILE_FLAGS of profile_serve.py), each
#                  tick's host phases and every graph call's GPU span; the codec's kernels and convs
#                                                                           -> profile_serve_h200.json
#       timeline   where a new turn's first audio goes in the served engine, stage by stage: lone turns
#                  and 1 turn/s, with EngineConfig.quiet_rows and without (turn_timeline.py)
#                                                                           -> timeline[_TAG]_h200.json
#
# side-by-side and parity need the official package's wheels carried as `.whl` (ignored by git; how to
# fetch them: shared/research/peer-baseline.md, "How to repeat"; .whl/qwen3-oracle/ or .whl/ itself).
# Every step has its own timeout, clamped to what is left of the call (BUDGET_S, default 585 s of the
# device's 600-s limit), so one hang cannot eat the call; a step that would get under 20 s is skipped
# and says so. Each JSON gets a "meta" object first: the step's exact command, the mode, commit,
# source_sha1 (sha1 over the tree's .py files, to check the copy against a commit where COMMIT was not
# given), machine (GPU, driver, torch / CUDA / Triton / Python), date, rc and seconds. The full output
# of every step goes to $OUT/<mode>.log; stdout shows progress lines and a summary last. Files end in
# the card that made them (_h200 as above, _h100 where the device lent an H100). At most 8
# files come back from $OUT: every mode writes fewer. Copy the JSONs (and PNGs) into benchmarks/results/
# unchanged; the README's rows name the file and key they come from.
set -o pipefail
export PYTHONUNBUFFERED=1

MODE=${1:-}
shift || true
STEPS=("$@")
OUT=${OUT:-artifacts/gpu}
mkdir -p "$OUT"
LOG="$OUT/$MODE.log"
DEADLINE=${BUDGET_S:-585}
SHOW='^\[|^== |Error|error|passed|failed|Traceback'
declare -a STATUS=()

usage() { sed -n '2,/^set -o pipefail/p' "$0" | grep '^#'; exit 2; }
case "$MODE" in headline | kernels | throughput | front-door | gateways | startup | side-by-side | parity | clone | profile) ;; *) usage ;; esac
: > "$LOG"

# voicewire.* is not installed on the device: a link tree makes the folders importable under that name.
# side_by_side.py starts our benchmark with PYTHONPATH removed, so the tree also goes into a .pth file
# of the interpreter's site-packages when that is writable (the device machine starts bare each lease).
if ! python3 -c "import voicewire.engine" > /dev/null 2>&1; then
  mkdir -p /tmp/vw/voicewire
  for d in engine realtime kernels web; do ln -sfn "$PWD/$d" "/tmp/vw/voicewire/$d"; done
  export PYTHONPATH=/tmp/vw${PYTHONPATH:+:$PYTHONPATH}
  site=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" 2> /dev/null)
  if [ -n "$site" ] && [ -w "$site" ]; then echo /tmp/vw > "$site/voicewire-linktree.pth"; fi
fi

. benchmarks/meta.sh
meta_init "bash benchmarks/gpu.sh $MODE"
COMMIT=$VW_COMMIT
# the files are named by the card that made them (h200, or h100 where the device lent one)
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -1 | grep -oiE 'H[0-9]{3}' | tr 'A-Z' 'a-z')
CARD=${CARD:-h200}
echo "[$MODE] commit $VW_COMMIT, source_sha1 $VW_SOURCE_SHA1, machine $VW_MACHINE" | tee -a "$LOG"

want() { [ ${#STEPS[@]} -eq 0 ] || [[ " ${STEPS[*]} " == *" $1 "* ]]; }

# step NAME MAX_S CMD...: CMD under `timeout min(MAX_S, what is left)`; sets RC, SECS, CMD.
step() {
  local name=$1 max=$2
  shift 2
  local left=$((DEADLINE - SECONDS - 5))
  local t=$((max < left ? max : left))
  CMD="$*" RC=125 SECS=0
  if [ "$t" -lt 20 ]; then
    echo "[$name] skipped: ${left} s left of the call" | tee -a "$LOG"
    STATUS+=("$name: skipped (${left} s left)")
    return 0
  fi
  echo "== $name (timeout $t s): $CMD" | tee -a "$LOG"
  local t0=$SECONDS
  timeout -k 10 "$t" "$@" 2>&1 | tee -a "$LOG" | grep --line-buffered -E "$SHOW" | cut -c1-300
  RC=${PIPESTATUS[0]} SECS=$((SECONDS - t0))
  STATUS+=("$name: rc $RC, $SECS s$([ "$RC" = 124 ] && echo ", timed out at $t s")")
}

# oracle_site: install the carried official-package wheels into /tmp/oracle_site.
oracle_site() {
  local whl=(.whl/qwen3-oracle/*.whl)
  [ -e "${whl[0]}" ] || whl=(.whl/*.whl)
  if [ ! -e "${whl[0]}" ]; then
    echo "[$MODE] no wheels under .whl/: carry them (shared/research/peer-baseline.md, How to repeat)" | tee -a "$LOG"
    STATUS+=("$MODE: not run, no .whl/")
    return 1
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/oracle_site "${whl[@]}" 2>&1 \
    | tee -a "$LOG" | tail -3
}

# suites_json OUT WHAT "CMD|RC|SECS"...: the summary line and failures of each pytest run, from the log.
suites_json() {
  local out=$1 what=$2
  shift 2
  VW_WHAT=$what VW_SUITES=$(printf '%s\n' "$@") python3 - "$LOG" "$out" << 'EOF'
import json, os, re, sys
log = open(sys.argv[1]).read()
suites = []
for line in os.environ["VW_SUITES"].splitlines():
    cmd, rc, secs = line.rsplit("|", 2)
    part = log.split(f": {cmd}\n", 1)[-1].split("\n== ", 1)[0] if f": {cmd}\n" in log else ""
    summary = [l for l in part.splitlines() if re.search(r"\d+ (passed|failed|error)", l)]
    suites.append({
        "command": cmd, "rc": int(rc), "seconds": int(secs),
        "summary": summary[-1].strip("= ") if summary else None,
        "failed": [l for l in part.splitlines() if l.startswith(("FAILED", "ERROR"))][:50],
    })
json.dump({"what": os.environ["VW_WHAT"], "suites": suites}, open(sys.argv[2], "w"), indent=1)
EOF
}

# gpu_tests JSON: every GPU test, the summary line and failures of each suite.
gpu_tests() {
  local out=$1
  # the kernels' files are mostly Triton compiles (CPU-bound): spread over processes, one file each, while
  # test_gpu.py's model builds run in one of them
  local xdist=()
  python3 -c "import xdist" 2> /dev/null && xdist=(-n 4 --dist loadfile)
  step tests 330 python3 -m pytest -q -p no:cacheprovider "${xdist[@]}" tests/kernels tests/engine/qwen3/test_gpu.py
  local c1=$CMD r1=$RC s1=$SECS
  step tests-codec-cuda 90 env VOICEWIRE_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
    tests/engine/qwen3/test_codec_ragged.py
  local c2=$CMD r2=$RC s2=$SECS
  suites_json "$out" "every GPU test of the tree on the lent GPU" "$c1|$r1|$s1" "$c2|$r2|$s2"
  CMD="$c1; $c2" RC=$((r1 > r2 ? r1 : r2)) SECS=$((s1 + s2))
  stamp "$out"
}

if [ "$MODE" = headline ]; then
  if want serving; then
    step serving 330 python3 benchmarks/serving_bench.py --size 1.7b --sections step,codec,single,serve \
      --step-variants fused --step-batches 1,8,32,64,128 --rates 1,20,40,60,80,100 --rate-duration-s 8 \
      --concurrency 64,128 --closed-duration-s 6 --out "$OUT/serving_${CARD}.json" --plot "$OUT/serving_${CARD}.png"
    stamp "$OUT/serving_${CARD}.json"
  fi
  if want step-0.6b; then
    step step-0.6b 90 python3 benchmarks/serving_bench.py --size 0.6b --sections step --step-variants fused \
      --step-batches 1,64 --out "$OUT/step_0.6b_${CARD}.json"
    stamp "$OUT/step_0.6b_${CARD}.json"
  fi
  if want tests; then gpu_tests "$OUT/gpu_tests_${CARD}.json"; fi
fi

if [ "$MODE" = throughput ]; then
  if want levers; then
    SIZE=${SIZE:-1.7b}
    name=throughput$([ "$SIZE" = 1.7b ] || echo "_$SIZE")_${CARD}
    step levers 420 python3 benchmarks/serving_bench.py --size "$SIZE" --sections codec,serve \
      --serve-variants "${VARIANTS:-serial-b128,serial,overlap,served}" --max-batch "${MAX_BATCH:-256}" --max-slots 512 \
      --max-prefill-batch "${PREFILL_BATCH:-32}" \
      --rates "${RATES:-120,160,200,240}" --rate-duration-s 8 --concurrency '' --out "$OUT/$name.json"
    stamp "$OUT/$name.json"
  fi
  if want tests; then
    step tests 300 python3 -m pytest -q -p no:cacheprovider tests/engine/qwen3/test_gpu.py ${TESTS_K:+-k "$TESTS_K"}
    suites_json "$OUT/gpu_tests_qwen3_${CARD}.json" "the Qwen3 GPU tests on the lent GPU" "$CMD|$RC|$SECS"
    stamp "$OUT/gpu_tests_qwen3_${CARD}.json"
  fi
fi

# The gateway's packages and Ray, carried as .whl/site.tar.xz (benchmarks/device_site.sh), unpacked once
# a machine; or the gateway's wheels alone, carried as .whl/gateway
if [ "$MODE" = front-door ] || [ "$MODE" = startup ] || [ "$MODE" = gateways ]; then
  if [ -f .whl/site.tar.xz ]; then
    [ -d /tmp/devsite/bin ] || { mkdir -p /tmp/devsite && xz -dc .whl/site.tar.xz | tar -C /tmp/devsite -x; }
    export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}/tmp/devsite PATH=/tmp/devsite/bin:$PATH
  elif ! python3 -c "import aiortc, av, websockets, zmq" > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/gw .whl/gateway/*.whl 2>&1 | tail -3
    export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}/tmp/gw
  fi
  SIZE=${SIZE:-1.7b}
fi

if [ "$MODE" = startup ]; then
  name="startup_${SIZE}${TAG:+_$TAG}_${CARD}"
  # shellcheck disable=SC2086  # SERVE_FLAGS is a list of flags
  step startup 570 python3 benchmarks/startup.py --starts "${STARTS:-2}" --cache-dir "${CACHE_DIR:-}" --out "$OUT/$name.json" \
    -- --model qwen3-tts --qwen-size "$SIZE" --device cuda --random-weights ${SERVE_FLAGS:-}
  stamp "$OUT/$name.json"
fi

if [ "$MODE" = front-door ]; then
  name="front_door_${SIZE}${TAG:+_$TAG}_${CARD}"
  # shellcheck disable=SC2086  # SERVE_FLAGS is a list of flags
  step front-door 570 python3 benchmarks/front_door.py --rates "${RATES-1,60,80,90,100,110}" \
    --words-rates "${WORDS_RATES-1,80}" --http-rates "${HTTP_RATES:-}" --duration-s "${DURATION_S:-10}" ${WORDS_FIRST:+--words-first} ${RATES_AGAIN:+--rates-again "$RATES_AGAIN"} ${WORDS_ONE_PROC:+--words-one-proc "$WORDS_ONE_PROC"} ${PRESTART:+--prestart} \
    --engine-only "${ENGINE_ONLY---size $SIZE --max-batch 512 --max-slots 512 --max-seq-len 1536 --length-scale 0.74}" \
    --out "$OUT/$name.json" --plot "$OUT/$name.png" \
    -- --model qwen3-tts --qwen-size "$SIZE" --device cuda --random-weights ${SERVE_FLAGS:-}
  stamp "$OUT/$name.json"
fi

if [ "$MODE" = gateways ]; then
  name="gateway_workers_${SIZE}_${CARD}"
  step gateways 570 python3 benchmarks/gateway_workers.py --workers "${WORKERS:-1,4}" \
    --peers "${PEERS:-16,32,48,64,96,128}" --out "$OUT/$name.json" \
    -- --model qwen3-tts --qwen-size "$SIZE" --device cuda --random-weights
  stamp "$OUT/$name.json"
fi

if [ "$MODE" = kernels ]; then
  if want attention; then
    step attention 150 python3 benchmarks/kernels_bench.py --out "$OUT/kernels_${CARD}.json"
    stamp "$OUT/kernels_${CARD}.json"
  fi
  if want linear; then
    step linear 150 python3 benchmarks/linear_bench.py --rows 1,64 --out "$OUT/linear_${CARD}.json"
    stamp "$OUT/linear_${CARD}.json"
  fi
  if want gemv; then
    step gemv 170 python3 benchmarks/gemv_bench.py --out "$OUT/gemv_${CARD}.json"
    stamp "$OUT/gemv_${CARD}.json"
  fi
  if want conv; then
    step conv 150 python3 benchmarks/conv_bench.py ${CONV_FLAGS:-} --out "$OUT/conv_${CARD}.json"
    stamp "$OUT/conv_${CARD}.json"
  fi
  if want codec; then
    # the codec is the same for both sizes: the 0.6B build captures its graphs fastest
    cmds=()
    export CODEC_VARIANTS=${CODEC_VARIANTS:-served cudnn}
    for v in $CODEC_VARIANTS; do
      case $v in
        torch-ops) flags=(--codec-torch-ops --cudnn-heuristics --codec-conv-kernel off) ;;
        kernel-heuristics) flags=(--cudnn-heuristics --codec-conv-kernel off) ;;
        cudnn) flags=(--codec-conv-kernel off) ;;
        conv-kernel) flags=(--codec-conv-kernel all) ;;
        served) flags=() ;;
      esac
      step "codec-$v" 110 python3 benchmarks/serving_bench.py --size 0.6b --sections codec --max-batch 64 \
        --max-slots 64 "${flags[@]}" --out "/tmp/codec_$v.json"
      cmds+=("$CMD")
    done
    python3 - "$OUT/codec_${CARD}.json" << 'EOF'
import json, os, sys
variants = {}
whats = {"torch-ops": "SnakeBeta, norms and SwiGLU as torch ops, cuDNN's heuristic conv algorithms",
         "kernel-heuristics": "the codec's kernels, cuDNN's heuristic conv algorithms",
         "cudnn": "the codec's kernels, conv algorithms timed by cuDNN during capture",
         "served": "the codec's kernels, the k > 1 convs on kernels/conv1d.py (cuDNN, timed, for calls of < 32 rows x frames)",
         "conv-kernel": "the codec's kernels, the k > 1 convs on kernels/conv1d.py at every call"}
for v in os.environ["CODEC_VARIANTS"].split():
    what = whats.get(v, v)
    try:
        d = json.load(open(f"/tmp/codec_{v}.json"))
        variants[v] = {"what": what, "command": d.get("command"), "serve_model": d.get("serve_model"), "codec": d.get("codec")}
    except (OSError, ValueError) as err:
        variants[v] = {"what": what, "error": repr(err)}
json.dump({"what": "codec decode per CUDA-graph call (streams x frames), ms", "variants": variants},
          open(sys.argv[1], "w"), indent=1)
EOF
    CMD=$(printf '%s; ' "${cmds[@]}") CMD=${CMD%; }
    stamp "$OUT/codec_${CARD}.json"
  fi
fi

if [ "$MODE" = side-by-side ]; then
  if oracle_site; then
    step side-by-side 560 python3 benchmarks/side_by_side.py --size 1.7b --oracle-site /tmp/oracle_site \
      --workdir /tmp/sbs --out "$OUT/side_by_side_${CARD}.json" --official-timeout-s 200 --ours-timeout-s 330 \
      --official-args=--e2e-batch -- --sections step,single,serve --step-variants fused \
      --step-batches 1,64,128,256 --max-batch 256 --max-slots 512 --rates 1,200 --rate-duration-s 8 \
      --concurrency 128,256 --closed-duration-s 6 --bursts 256,512 --plot "$OUT/side_by_side_${CARD}.png"
    stamp "$OUT/side_by_side_${CARD}.json"
    cp /tmp/sbs/official.log "$OUT/official.log" 2> /dev/null
    tail -c 2000000 /tmp/sbs/ours.log > "$OUT/ours.log" 2> /dev/null
  fi
fi

if [ "$MODE" = parity ]; then
  if oracle_site; then
    step parity 500 python3 benchmarks/gpu_qwen3_check.py --oracle-site /tmp/oracle_site --out /tmp/parity
    cp /tmp/parity/results.json "$OUT/parity_${CARD}.json" 2> /dev/null
    stamp "$OUT/parity_${CARD}.json"
  fi
fi

if [ "$MODE" = clone ]; then
  if oracle_site; then
    # The tests find the oracle through VOICEWIRE_ORACLE_DIR/site and a READY stamp (oracle_setup.sh's
    # layout; the device has torchaudio, so no stub). Our side needs soxr alone (the 16 kHz reference),
    # not the oracle's older transformers.
    mkdir -p /tmp/oracle_dir /tmp/ours_site && ln -sfn /tmp/oracle_site /tmp/oracle_dir/site
    touch /tmp/oracle_dir/READY-device && cp -r /tmp/oracle_site/soxr* /tmp/ours_site/
    if want clone-parity; then
      step clone-parity 300 env VOICEWIRE_TEST_DEVICE=cuda VOICEWIRE_ORACLE_DIR=/tmp/oracle_dir \
        PYTHONPATH="$PYTHONPATH:/tmp/ours_site" python3 -m pytest -q -p no:cacheprovider -rs \
        tests/engine/qwen3/test_clone_parity.py
      suites_json "$OUT/clone_parity_${CARD}.json" "voice cloning parity with qwen-tts 0.1.1, fp32 on CUDA" "$CMD|$RC|$SECS"
      stamp "$OUT/clone_parity_${CARD}.json"
    fi
    if want clone-precision; then
      step clone-precision 150 env PYTHONPATH="$PYTHONPATH:/tmp/ours_site" python3 benchmarks/clone_precision.py \
        --size 1.7b --device cuda --out "$OUT/clone_precision_${CARD}.json"
      stamp "$OUT/clone_precision_${CARD}.json"
    fi
  fi
fi

if [ "$MODE" = profile ]; then
  if want step; then
    step profile 200 python3 benchmarks/profile_step.py --size 1.7b --variants "${VARIANTS:-fused}" \
      --batches "${BATCHES:-1,64}" --max-batch "${MAX_BATCH:-128}" --max-slots "${MAX_BATCH:-128}" \
      --out "$OUT/profile${TAG:+_$TAG}_${CARD}.json"
    stamp "$OUT/profile${TAG:+_$TAG}_${CARD}.json"
  fi
  if want serve; then
    step profile-serve 420 python3 benchmarks/profile_serve.py --size 1.7b --rates "${RATES:-170}" \
      --variants "${VARIANTS:-served,serial}" --duration-s 5 ${SECTIONS:+--sections "$SECTIONS"} ${PROFILE_FLAGS:-} \
      --out "$OUT/profile_serve_${CARD}.json"
    stamp "$OUT/profile_serve_${CARD}.json"
  fi
  if want timeline; then
    name="timeline${TAG:+_$TAG}_${CARD}"
    step timeline 240 python3 benchmarks/turn_timeline.py --size 1.7b --turns 40 --rate 1 --duration-s 25 \
      --out "$OUT/$name.json"
    stamp "$OUT/$name.json"
  fi
fi

# the summary: step status, then the figures the README's rows quote
{
  echo "== summary: gpu.sh $MODE ${STEPS[*]} (commit $COMMIT, $SECONDS s)"
  printf '  %s\n' "${STATUS[@]}"
  python3 - "$OUT" "$MODE" "$CARD" << 'EOF'
import json, os, sys
out, mode, card = sys.argv[1:4]
MINE = {"headline": (f"serving_{card}.json", f"step_0.6b_{card}.json", f"gpu_tests_{card}.json"),
        "side-by-side": (f"side_by_side_{card}.json",)}.get(mode, ())
def load(name):
    if name not in MINE:  # only this call's files: $OUT may hold another mode's
        return None
    try:
        return json.load(open(os.path.join(out, name)))
    except (OSError, ValueError):
        return None
def f(x, n=2):
    return "-" if x is None else f"{x:.{n}f}"
s = load(f"serving_{card}.json")
for name, d in (("1.7B", s), ("0.6B", load(f"step_0.6b_{card}.json"))):
    for b, r in ((d or {}).get("step", {}).get("variants", {}).get("fused", {}).get("batches", {}) or {}).items():
        print(f"  step {name} B={b}: GPU {f(r.get('step_gpu_ms'))} ms, call {f(r.get('generate_wall_ms_median'))} ms "
              f"(talker {f(r.get('talker_gpu_ms'))}, code predictor {f(r.get('code_predictor_gpu_ms'))}, "
              f"sampling {f(r.get('sampling_and_state_gpu_ms'))})")
if s:
    print(f"  floor: {f(s.get('step', {}).get('floor', {}).get('step_floor_ms'))} ms at {f(s.get('step', {}).get('copy_rate_gb_s'), 0)} GB/s")
    for k in ("B1_T1", "B16_T12", "B64_T12"):
        print(f"  codec {k}: {f((s.get('codec') or {}).get(k, {}).get('graph_ms'))} ms")
    serve = s.get("serve") or {}
    one = serve.get("single_10s") or {}
    print(f"  single 10-s: TTFP p50 {f(one.get('ttfp_ms_p50'), 1)} ms")
    for p in serve.get("open_loop", []):
        print(f"  open {p.get('rate')} req/s: {p.get('requests')} req, TTFP p50 {f(p.get('ttfp_ms_p50'), 1)} / p95 "
              f"{f(p.get('ttfp_ms_p95'), 1)} ms, underruns {p.get('underrun_requests')}, rejected {p.get('rejected')}, "
              f"{f(p.get('audio_s_per_s'), 1)} audio-s/s")
    for p in serve.get("closed_loop", []):
        print(f"  closed {p.get('concurrency')}: TTFP p95 {f(p.get('ttfp_ms_p95'), 1)} ms, underruns "
              f"{p.get('underrun_requests')} of {p.get('requests')}, {f(p.get('audio_s_per_s'), 1)} audio-s/s")
for suite in (load(f"gpu_tests_{card}.json") or {}).get("suites", []):
    print(f"  tests: {suite['summary']} (rc {suite['rc']}) {' '.join(suite['failed'][:5])}")
c = (load(f"side_by_side_{card}.json") or {}).get("comparison")
if c:
    print("  side by side:", json.dumps({k: {r: v[r] for r in v if r.startswith("ratio")}
                                         for k, v in c.items() if isinstance(v, dict)}))
EOF
} 2>&1 | tee -a "$LOG"
