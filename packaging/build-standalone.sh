#!/usr/bin/env bash
# Build the standalone one-folder app and smoke-test it (slow: compiles llama.cpp).
#   packaging/build-standalone.sh              -> dist/localspec/localspec
#   BUILD_ROOT=/tmp/x DIST=/tmp/x/dist packaging/build-standalone.sh
#   REBUILD_LLAMA=1 ...      recompile llama.cpp even when the build venv already has the portable build
#   SKIP_SMOKE=1 ...         build only
#   SMOKE_LOCK=/tmp/localspec-heavy.lock ...   run the smoke generation under that lock
#
# The build venv lives in $BUILD_ROOT (default /tmp/localspec-standalone), never in the repo or in
# .venv. llama.cpp is compiled without GGML_NATIVE, with GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS:
# one libggml-cpu-<variant>.so per x86 instruction-set level (x64, sse42, sandybridge, haswell,
# skylakex, icelake, zen4, sapphirerapids...). At run time ggml loads the variant with the best score
# the CPU supports, so the app does not die with SIGILL on an older CPU. ggml looks for these
# backends next to the executable, so the spec puts them beside dist/localspec/localspec.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
BUILD_ROOT=${BUILD_ROOT:-/tmp/localspec-standalone}
VENV=$BUILD_ROOT/venv
DIST=${DIST:-$REPO/dist}
PY=${PYTHON:-python3.11}
LLAMA_VERSION=0.3.36
# LLAVA_BUILD=OFF: localspec never loads libmtmd (multimodal), so the app skips it and its compile.
LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DLLAVA_BUILD=OFF"
mkdir -p "$BUILD_ROOT"
cd "$REPO"
stamp() { date +%s; }
t0=$(stamp)

if [ ! -x "$VENV/bin/python" ]; then
  echo "== build venv: $VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip
fi
"$VENV/bin/pip" install --quiet numpy typing-extensions diskcache jinja2   # llama-cpp-python's deps (it is installed --no-deps)
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
variants() { find "$site" -name 'libggml-cpu-*.so' 2>/dev/null; }
if [ -n "${REBUILD_LLAMA:-}" ] || [ -z "$(variants)" ]; then
  echo "== llama-cpp-python $LLAMA_VERSION from source: $LLAMA_CMAKE_ARGS (log: $BUILD_ROOT/llama-build.log)"
  "$VENV/bin/pip" download --quiet --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_VERSION" -d "$BUILD_ROOT/sdist"
  t1=$(stamp)
  # --no-cache-dir --force-reinstall: pip's wheel cache ignores CMAKE_ARGS and would hand back
  # the native CPU wheel built earlier.
  CMAKE_ARGS="$LLAMA_CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-$(nproc)} \
    nice -n 19 "$VENV/bin/pip" install --verbose --no-cache-dir --force-reinstall --no-deps \
    "$BUILD_ROOT/sdist/llama_cpp_python-$LLAMA_VERSION.tar.gz" >"$BUILD_ROOT/llama-build.log" 2>&1 \
    || { tail -40 "$BUILD_ROOT/llama-build.log"; echo "error: llama.cpp build failed (log above)" >&2; exit 1; }
  echo "   compiled in $(( $(stamp) - t1 )) s"
fi
[ -n "$(variants)" ] || { echo "error: no libggml-cpu-<variant>.so under $site" >&2; exit 1; }
echo "   CPU variants: $(variants | xargs -n1 basename | sed 's/libggml-cpu-//; s/.so$//' | sort | tr '\n' ' ')"
echo "== pyinstaller + localspec (non-editable, so PyInstaller sees the packaged data files)"
"$VENV/bin/pip" install --quiet pyinstaller
"$VENV/bin/pip" install --quiet --force-reinstall --no-deps "$REPO"
"$VENV/bin/pip" install --quiet "$REPO"   # its dependencies (llama-cpp-python already there: kept)

echo "== PyInstaller"
t2=$(stamp)
"$VENV/bin/pyinstaller" --noconfirm --clean --log-level WARN --distpath "$DIST" \
  --workpath "$BUILD_ROOT/pyinstaller" packaging/localspec.spec
APP=$DIST/localspec/localspec
echo "   packaged in $(( $(stamp) - t2 )) s: $APP ($(du -sh "$DIST/localspec" | cut -f1))"

if [ -z "${SKIP_SMOKE:-}" ]; then
  echo "== smoke test (models from the normal store)"
  # SMOKE_LOCK=/path/to.lock: hold that lock while a model is loaded (a shared build box).
  lock=(); [ -n "${SMOKE_LOCK:-}" ] && lock=(flock "$SMOKE_LOCK")
  "$APP" --version
  "$APP" doctor || true   # exit status 1 only means doctor found a problem; its output is the check
  "$APP" doctor --json >"$BUILD_ROOT/doctor.json" || true
  "${lock[@]}" "$APP" -v generate --no-pull --mode off --max-tokens 8 --threads 2 --n-ctx 512 "def add(a, b):" 2>"$BUILD_ROOT/generate.err" \
    || { cat "$BUILD_ROOT/generate.err"; exit 1; }
  grep -o "load_backend: loaded CPU backend from .*" "$BUILD_ROOT/generate.err" | head -1 || true
fi
echo "standalone build OK in $(( $(stamp) - t0 )) s: $APP"
