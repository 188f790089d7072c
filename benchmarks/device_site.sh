#!/usr/bin/env bash
# One package tree for the lent GPU machine, which lacks the gateway's packages and Ray and takes at
# most 64 MiB of tree a call: the wheels of .whl/gateway (aiortc, av, websockets, pyzmq and their
# needs, ~43 MB) and .whl/ray (benchmarks/ray_wheels.sh, ~40 MB) installed for its Python 3.12 and
# packed with xz into .whl/site.tar.xz (~51 MB, ignored by git), so one call carries both.
#
#   bash benchmarks/ray_wheels.sh && bash benchmarks/device_site.sh
#   run(carry=[".whl/site.tar.xz"], command="COMMIT=... bash benchmarks/gpu.sh MODE")
#
# gpu.sh unpacks it into /tmp/devsite (once a machine) and puts it on PYTHONPATH and PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
PY312=${PY312:-$(ls -d ~/.pyenv/versions/3.12*/bin/python3 2> /dev/null | head -1)}
PY312=${PY312:-$(command -v python3.12)}
[ -x "$PY312" ] || { echo "needs a Python 3.12 to install the wheels (PY312=...)" >&2; exit 2; }
SITE=$(mktemp -d)
trap 'rm -rf "$SITE"' EXIT
"$PY312" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" --python-version 3.12 \
  --implementation cp --only-binary=:all: --platform manylinux_2_28_x86_64 --platform manylinux_2_26_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  --platform manylinux_2_5_x86_64 .whl/gateway/*.whl .whl/ray/*.whl
# the console scripts name this machine's interpreter: the device's python3 runs them there
sed -i '1s|^#!.*python.*$|#!/usr/bin/env python3|' "$SITE"/bin/*
tar -C "$SITE" -cf - . | xz -T0 -9 > .whl/site.tar.xz
ls -l .whl/site.tar.xz
