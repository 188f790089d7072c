#!/usr/bin/env bash
# Ray for the lent GPU machine, which has none and takes at most 64 MiB of tree a call: the ray wheel
# less what an engine core and a gateway never load (the Java jars, RLlib, Tune, Train, Data, Serve,
# LLM, the dashboard's web client), and the packages Ray needs that the machine lacks (jsonschema and
# its own), for its Python 3.12, into .whl/ray (~40 MB; ignored by git).
#
#   bash benchmarks/ray_wheels.sh
#
# benchmarks/device_site.sh then packs it with the gateway's wheels into one tree that a call can carry.
set -euo pipefail
cd "$(dirname "$0")/.."
RAY_VERSION=${RAY_VERSION:-2.60.0}
OUT=.whl/ray
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$OUT"
download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d "$1" "${@:2}"
}
download "$TMP" "ray==$RAY_VERSION"
download "$OUT" jsonschema jsonschema-specifications referencing rpds-py
python3 - "$TMP"/ray-*.whl "$OUT" << 'EOF'
import os, sys, zipfile
src, out = sys.argv[1], sys.argv[2]
DROP = ("ray/jars/", "ray/rllib/", "ray/tune/", "ray/train/", "ray/data/", "ray/serve/", "ray/llm/",
        "ray/dashboard/client/build/")
dst = os.path.join(out, os.path.basename(src))
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
    for item in zin.infolist():
        if not item.filename.startswith(DROP):
            zout.writestr(item, zin.read(item.filename))
print(f"{dst}: {os.path.getsize(dst) / 1e6:.1f} MB (from {os.path.getsize(src) / 1e6:.1f})")
EOF
du -sh "$OUT"
