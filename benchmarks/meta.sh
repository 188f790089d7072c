# Sourced by benchmarks/gpu.sh and cpu.sh: what every result file says about where it came from.
#   meta_init VIA   sets VW_VIA, VW_COMMIT, VW_SOURCE_SHA1, VW_MACHINE (COMMIT=<sha> overrides git: the
#                   device's copy of the tree has no .git)
#   stamp FILE      puts "meta" first in a result JSON: CMD (the exact command), VW_VIA (the entry point),
#                   commit, source_sha1 (sha1 over the tree's .py files, to match a copy to a commit),
#                   machine, date (UTC), RC and SECS of the step that wrote it
meta_init() {
  export VW_VIA=$1
  local dirty=""
  if git rev-parse --git-dir > /dev/null 2>&1 && [ -n "$(git status --porcelain --untracked-files=no 2> /dev/null)" ]; then
    dirty="+uncommitted"
  fi
  export VW_COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2> /dev/null || echo unknown)$dirty}
  export VW_SOURCE_SHA1=$(find engine kernels realtime benchmarks tests -name '*.py' -not -path '*/__pycache__/*' \
    2> /dev/null | LC_ALL=C sort | xargs sha1sum 2> /dev/null | sha1sum | cut -c1-12)
  VW_MACHINE=$("${PY:-python3}" - 2> /dev/null << 'EOF'
import json, os, platform, shutil, subprocess
m = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}
if shutil.which("nvidia-smi"):
    q = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm", "--format=csv,noheader"]
    rows = subprocess.run(q, capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
    keys = ("name", "driver", "memory", "sm_clock_at_start", "sm_clock_max")
    m["gpus"] = [dict(zip(keys, map(str.strip, r.split(",")))) for r in rows]
try:
    import torch
    m.update(torch=torch.__version__, cuda=torch.version.cuda)
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        m.update(gpu=p.name, sm_count=p.multi_processor_count, memory_gib=round(p.total_memory / 2**30, 1))
        import triton
        m["triton"] = triton.__version__
except ImportError as err:
    m["import_error"] = repr(err)
print(json.dumps(m))
EOF
  )
  export VW_MACHINE=${VW_MACHINE:-'{}'}
}

stamp() {
  if [ ! -f "$1" ]; then
    echo "[${VW_VIA}] no $1 (rc ${RC:-?})" | tee -a "${LOG:-/dev/null}"
    return 0
  fi
  VW_CMD="$CMD" VW_RC=${RC:-0} VW_SECS=${SECS:-0} "${PY:-python3}" - "$1" << 'EOF'
import datetime, json, os, sys
path = sys.argv[1]
data = json.load(open(path))
meta = {
    "command": os.environ["VW_CMD"],
    "via": os.environ["VW_VIA"],
    "commit": os.environ["VW_COMMIT"],
    "source_sha1": os.environ["VW_SOURCE_SHA1"],
    "machine": json.loads(os.environ["VW_MACHINE"] or "{}"),
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    "rc": int(os.environ["VW_RC"]),
    "seconds": int(os.environ["VW_SECS"]),
}
data = {"meta": meta, **{k: v for k, v in data.items() if k != "meta"}}
json.dump(data, open(path, "w"), indent=1, default=str)
EOF
}
