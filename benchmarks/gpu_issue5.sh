#!/usr/bin/env bash
# Device runs of issue 5 (serving speed on the H200). Usage, from the repo root on the device:
#   bash benchmarks/gpu_issue5.sh step   # GPU tests, frame step (eager / graphs / compile), codec, 0.6B
#   bash benchmarks/gpu_issue5.sh sbs    # side by side with the official qwen-tts (carry .whl) + serving sweep
#   bash benchmarks/gpu_issue5.sh fused  # GPU tests of the fused decode kernels, fused vs unfused step, tile sweep
#   bash benchmarks/gpu_issue5.sh check  # the served code: GPU tests of the fused path, step variants
#   bash benchmarks/gpu_issue5.sh pdl    # the same with PDL / prefetch variants, and a kernel profile
#   bash benchmarks/gpu_issue5.sh codec  # every GPU test; the codec with / without the SnakeBeta kernel
#   bash benchmarks/gpu_issue5.sh gemv   # one-/two-row linears: PDL chains + per-shape sweep, step with / without, GPU tests
#   bash benchmarks/gpu_issue5.sh final  # the served tree: step, TTFP at 1 / 40 req/s, 0.6B, every GPU test
# Every step has its own timeout, so one hang cannot eat the call; results land in $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1
mode=${1:-step}
# every GPU test: the kernels, the Qwen3 GPU tests, the codec's ragged calls; $1 = seconds for the first two
all_gpu_tests() {
  timeout "$1" python3 -m pytest -q -p no:cacheprovider tests/kernels tests/engine/qwen3/test_gpu.py > "$OUT/pytest_gpu.txt" 2>&1
  VOICEWIRE_TEST_DEVICE=cuda timeout 60 python3 -m pytest -q -p no:cacheprovider tests/engine/qwen3/test_codec_ragged.py >> "$OUT/pytest_gpu.txt" 2>&1
  grep -E "passed|failed" "$OUT/pytest_gpu.txt"; grep -E "^(FAILED|ERROR)|^E  .*Error" "$OUT/pytest_gpu.txt" | cut -c1-300 | head -8
}
# the 0.6B fused step at B = 1 and 64 within $1 seconds
step_06b() {
  timeout "$1" python3 benchmarks/serving_bench.py --size 0.6b --sections step --step-variants fused \
    --step-batches 1,64 --out "$OUT/step_0.6b.json" 2>&1 | grep -E "^\[|Error|error" | cut -c1-330 | tail -3
}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)"; } > "$OUT/machine_$mode.txt" 2>&1
if [ "$mode" = step ]; then
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/engine/qwen3/test_gpu.py > "$OUT/pytest_gpu.txt" 2>&1
  tail -5 "$OUT/pytest_gpu.txt"
  timeout 220 python3 benchmarks/serving_bench.py --size 1.7b --sections step,codec --step-variants eager,graphs \
    --step-batches 1,8,32,64,128 --out "$OUT/step_1.7b.json" 2>&1 | grep -E "^\[|Error|error" | tail -25
  timeout 130 python3 benchmarks/serving_bench.py --size 1.7b --sections step --step-variants compile \
    --step-batches 1,64 --out "$OUT/compile_1.7b.json" 2>&1 | grep -E "^\[|Error|error" | tail -8
  timeout 80 python3 benchmarks/serving_bench.py --size 0.6b --sections step --step-variants graphs \
    --step-batches 1,64 --out "$OUT/step_0.6b.json" 2>&1 | grep -E "^\[|Error|error" | tail -6
fi
if [ "$mode" = check ]; then
  timeout 110 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_fused_decode_ops.py \
    tests/engine/qwen3/test_gpu.py -k "fused or graph_replay or row_kernels" > "$OUT/pytest_gpu.txt" 2>&1
  tail -1 "$OUT/pytest_gpu.txt"; grep -E "^(FAILED|ERROR)|^E  .*Error" "$OUT/pytest_gpu.txt" | cut -c1-300 | head -8
  timeout 150 python3 benchmarks/serving_bench.py --size 1.7b --sections step --step-variants fused,fused-kernels,fused-cublas \
    --step-batches 1,8,16,32,64,128 --out "$OUT/step_1.7b.json" 2>&1 | grep -E "^\[|Error|error" | cut -c1-200 | tail -18
  step_06b $((250 - SECONDS))
fi
if [ "$mode" = fused ]; then
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_fused_decode_ops.py \
    tests/engine/qwen3/test_gpu.py > "$OUT/pytest_gpu.txt" 2>&1
  tail -2 "$OUT/pytest_gpu.txt"; grep -E "^(FAILED|ERROR)|^E  .*Error|bf16 fused" "$OUT/pytest_gpu.txt" | cut -c1-300 | head -12
  timeout 170 python3 benchmarks/serving_bench.py --size 1.7b --sections step --step-variants fused-eager,fused \
    --step-batches 1,8,32,64,128 --eager-batches 1 --out "$OUT/step_1.7b.json" 2>&1 | grep -E "^\[|Error|error" | cut -c1-330 | tail -8
  step_06b 60
  timeout 130 python3 benchmarks/serving_bench.py --size 1.7b --sections serve --rates 1,20,40 --rate-duration-s 6 \
    --concurrency 64 --closed-duration-s 5 --out "$OUT/serve_1.7b.json" > "$OUT/serve.log" 2>&1
  grep -E "^\[(single|open|closed)\]" "$OUT/serve.log" | cut -c1-400; grep -m3 -E "Error|assert" "$OUT/serve.log" | cut -c1-300
  timeout $((560 - SECONDS)) python3 benchmarks/linear_bench.py --rows 1,64 --out "$OUT/linear.json" 2>&1 | cut -c1-200 | tail -22
fi
if [ "$mode" = pdl ]; then
  # programmatic dependent launch + L2 weight prefetch (kernels/pdl.py): tests, step variants, profile
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_fused_decode_ops.py \
    tests/engine/qwen3/test_gpu.py -k "fused or graph_replay or row_kernels or pdl or gathers" > "$OUT/pytest_gpu.txt" 2>&1
  tail -1 "$OUT/pytest_gpu.txt"; grep -E "^(FAILED|ERROR)|^E  .*Error" "$OUT/pytest_gpu.txt" | cut -c1-300 | head -8
  timeout 180 python3 benchmarks/serving_bench.py --size 1.7b --sections step \
    --step-variants fused,fused-nopdl,fused-noprefetch,fused-prefetch-all --step-batches 1,16,64,128 \
    --out "$OUT/step_1.7b.json" 2>&1 | grep -E "^\[|Error|error" | cut -c1-200 | tail -18
  timeout 100 python3 benchmarks/profile_step.py --size 1.7b --variants fused,fused-nopdl --batches 1,64 \
    --out "$OUT/profile_1.7b.json" 2>&1 | grep -E "^\[|Error|error" | cut -c1-400 | tail -6
  step_06b $((560 - SECONDS))
fi
if [ "$mode" = codec ]; then
  # every GPU test, then the codec per (streams, frames) graph: torch-op SnakeBeta (heuristic convs) / SnakeBeta kernel (heuristic convs) / the default (kernel, cuDNN-timed convs)
  all_gpu_tests 260
  # (run 3 of 2026-11-29 was made with variants kernel / torch-snake / cudnn-benchmark, before cuDNN
  # timing became the codec graphs' default; the same three configurations are these)
  for v in torch-snake cudnn-heuristics default; do
    flag="--$v"; [ $v = default ] && flag=""
    timeout 90 python3 benchmarks/serving_bench.py --size 0.6b --sections codec --max-batch 64 --max-slots 64 $flag \
      --out "$OUT/codec_$v.json" > "$OUT/codec_$v.log" 2>&1
    python3 -c "import json,sys; c=json.load(open(sys.argv[1]))['codec']; print(sys.argv[2], {k: round(v['graph_ms'], 2) for k, v in c.items() if 'graph_ms' in v})" "$OUT/codec_$v.json" $v
  done
fi
if [ "$mode" = gemv ]; then
  # the one-/two-row kernel (weights into registers before the PDL wait) against the tiled one
  timeout 170 python3 benchmarks/gemv_bench.py --out "$OUT/gemv_chains.json" 2>&1 | grep -E "^\[|Error" | cut -c1-200
  timeout 130 python3 benchmarks/serving_bench.py --size 1.7b --sections step --step-variants fused,fused-nogemv \
    --step-batches 1,2,64 --out "$OUT/step_1.7b.json" 2>&1 | grep -E "^\[|Error|error" | cut -c1-330 | tail -8
  step_06b 60
  all_gpu_tests $((570 - SECONDS))
fi
if [ "$mode" = final ]; then
  # the served tree with the GEMV path: step (with / without it), TTFP at 1 and 40 req/s, 0.6B, every GPU test
  timeout 300 python3 benchmarks/serving_bench.py --size 1.7b --sections step,single,serve \
    --step-variants fused,fused-nogemv --step-batches 1,2,64 --rates 1,40 --rate-duration-s 6 --concurrency 64 \
    --closed-duration-s 5 --out "$OUT/serve_1.7b.json" > "$OUT/serve.log" 2>&1
  grep -E "^\[(step|single|open|closed)" "$OUT/serve.log" | cut -c1-330; grep -m3 -E "invalid codes|Error|assert" "$OUT/serve.log" | cut -c1-300
  step_06b 60
  all_gpu_tests $((585 - SECONDS))
fi
if [ "$mode" = serve ]; then
  # the engine sweep again (random weights, same shapes), compile variant, then graphs only
  timeout 250 python3 benchmarks/serving_bench.py --size 1.7b --sections single,serve --compile \
    --rates 1,20,40,80 --rate-duration-s 8 --concurrency 16,64,128 --closed-duration-s 6 \
    --out "$OUT/serve_1.7b_compile.json" --plot "$OUT/serving_1.7b.png" > "$OUT/serve_compile.log" 2>&1
  grep -E "^\[(single|open|closed)\]" "$OUT/serve_compile.log" | cut -c1-420
  grep -m3 -E "invalid codes|Error|assert" "$OUT/serve_compile.log" | cut -c1-300
  if [ $SECONDS -lt 250 ]; then
    timeout $((325 - SECONDS)) python3 benchmarks/serving_bench.py --size 1.7b --sections serve \
      --rates 20,40 --rate-duration-s 8 --concurrency 64 --closed-duration-s 6 \
      --out "$OUT/serve_1.7b_graphs.json" > "$OUT/serve_graphs.log" 2>&1
    grep -E "^\[(open|closed)\]" "$OUT/serve_graphs.log" | cut -c1-300
    grep -m3 -E "invalid codes|Error|assert" "$OUT/serve_graphs.log" | cut -c1-300
  fi
fi
if [ "$mode" = sbs ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/oracle_site \
    .whl/qwen3-oracle/*.whl || exit 1
  timeout 540 python3 benchmarks/side_by_side.py --size 1.7b --oracle-site /tmp/oracle_site --workdir /tmp/sbs \
    --out "$OUT/side_by_side_1.7b.json" --official-timeout-s 200 --ours-timeout-s 320 --official-args=--e2e-batch \
    -- --sections step,single,serve --step-variants fused --step-batches 1,8,32,64,128 \
    --rates 1,20,40,60,80 --rate-duration-s 8 --concurrency 16,64,128 --closed-duration-s 6 --bursts 128,256 \
    --plot "$OUT/serving_1.7b.png" 2>&1 | tail -40
  cp /tmp/sbs/official.log "$OUT/official.log" 2>/dev/null; tail -c 200000 /tmp/sbs/ours.log > "$OUT/ours.log" 2>/dev/null
fi
