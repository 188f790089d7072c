#!/usr/bin/env bash
# Install the official Qwen3-TTS reference (PyPI qwen-tts 0.1.1) for the parity tests, isolated.
#
# qwen-tts needs transformers==4.57.3 (5.x fails at import), tokenizers 0.22 and huggingface_hub 0.36,
# older than our venv's, so everything goes into its own --target folder, used only through
# PYTHONPATH by the oracle subprocess (tests/engine/qwen3/oracle_run.py). torch, numpy, safetensors,
# cffi come from the interpreter's own site-packages. No dependency resolution (--no-deps): the list
# below is exactly what the package imports; pip's resolver would pull a CUDA torch.
#
#   tests/engine/qwen3/oracle_setup.sh            # into .oracle/ (git-ignored), idempotent
#   tests/engine/qwen3/oracle_setup.sh --packages # only the downloads (scripts/test: beside the venv's own
#                                                 # installs; the check, run after, imports the venv's numpy)
#   VOICEWIRE_ORACLE_DIR=/x PYTHON=python3 tests/engine/qwen3/oracle_setup.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
DIR="${VOICEWIRE_ORACLE_DIR:-$ROOT/.oracle}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"

PKGS=(
  qwen-tts==0.1.1
  transformers==4.57.3 tokenizers==0.22.2 huggingface_hub==0.36.2 accelerate==1.12.0
  einops==0.8.2 sox==1.5.0 soundfile==0.14.0
  requests==2.34.2 urllib3==2.8.0 certifi==2026.10.19.post1 charset_normalizer==3.5.3 tqdm==4.70.1
  librosa==0.11.0 lazy_loader==0.6 audioread==3.1.0 decorator==5.3.1 pooch==1.9.0 platformdirs==4.14.8
  soxr==1.1.0 joblib==1.6.0 cloudpickle==3.1.3 msgpack==1.2.4 scipy==1.17.1 numba==0.68.1
  llvmlite==0.50.0 threadpoolctl==3.8.0 standard-aifc==3.13.0 standard-sunau==3.13.0
)
STAMP="$DIR/READY-$(printf '%s\n' "${PKGS[@]}" "$("$PY" -c 'import sys; print(sys.version_info[:2])')" | sha1sum | cut -c1-12)"

if [ -f "$STAMP" ]; then
  echo "oracle env ready: $DIR"
  exit 0
fi

PACKAGES="$DIR/PACKAGES-$(printf '%s\n' "${PKGS[@]}" | sha1sum | cut -c1-12)"
if [ ! -f "$PACKAGES" ]; then
  rm -rf "$DIR"
  mkdir -p "$DIR/site"
  "$PY" -m pip install --quiet --disable-pip-version-check --no-deps --no-compile --target "$DIR/site" "${PKGS[@]}"
  touch "$PACKAGES"
fi
if [ "${1:-}" = --packages ]; then
  echo "oracle packages installed: $DIR"
  exit 0
fi

# torch 2.13.0+cpu has no torchaudio build; qwen-tts imports torchaudio.compliance.kaldi only for
# the 25 Hz tokenizer, so an empty stub satisfies the import. The test puts it on PYTHONPATH only
# when the interpreter has no real torchaudio.
mkdir -p "$DIR/stub/torchaudio/compliance"
touch "$DIR/stub/torchaudio/__init__.py" "$DIR/stub/torchaudio/compliance/__init__.py" \
  "$DIR/stub/torchaudio/compliance/kaldi.py"

STUB=""
"$PY" -c 'import torchaudio' 2>/dev/null || STUB=":$DIR/stub"
PYTHONPATH="$DIR/site$STUB" "$PY" -c '
import qwen_tts, transformers, tokenizers, huggingface_hub
assert transformers.__version__ == "4.57.3", transformers.__version__
assert tokenizers.__version__ == "0.22.2", tokenizers.__version__
print("qwen-tts", qwen_tts.__file__, "transformers", transformers.__version__)
'
touch "$STAMP"
echo "oracle env ready: $DIR"
