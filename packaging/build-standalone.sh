#!/usr/bin/env bash
# Build the standalone one-folder app (slow: rebuilds llama.cpp, ~10+ min on 2 cores) and smoke-test it.
#   packaging/build-standalone.sh            -> dist/localspec/localspec
# llama.cpp is built without GGML_NATIVE and with GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS: one
# libggml-cpu-<variant> per instruction-set level, picked at run time, so no SIGILL on older CPUs.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-$REPO/build/standalone-venv}
cd "$REPO"
python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip pyinstaller
"$VENV/bin/pip" install --quiet -e .
CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON" \
  "$VENV/bin/pip" install --no-cache-dir --force-reinstall --no-deps "llama-cpp-python==0.3.36"
"$VENV/bin/pyinstaller" --noconfirm --clean --distpath dist --workpath build/pyinstaller packaging/localspec.spec
APP=dist/localspec/localspec
echo "== smoke test: $APP"
"$APP" --version
"$APP" doctor || true   # exit status 1 only means doctor found a problem; its output is the check
"$APP" generate --no-pull --max-tokens 8 --threads 2 "def add(a, b):"
echo "standalone build OK: $APP"
