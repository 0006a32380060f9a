#!/usr/bin/env bash
# GPU cost check, run unattended from an unpacked gpu-bundle (offline; < 9 minutes).
#   bash gpu-check.sh [--cpu] [--small] [--dry-run] [--no-fa] [--q8] [--jobs N] [--arch N] [--build-only] [OUT_DIR]
# OUT_DIR (or $OUT) receives everything: build.log, calibration.json, predictions.json, summary.txt,
# check.log. Builds llama.cpp from the bundled source with cmake (no pip build backend needed):
# CUDA for the local GPU's architecture only (nvidia-smi compute_cap, e.g. 90 on an H200), or
# the CPU with --cpu / when no NVIDIA GPU is found. The built libraries are copied into the
# bundled llama_cpp/lib (and LLAMA_CPP_LIB_PATH points there), so the bundled pure-Python
# llama-cpp-python loads them. Then gpu_check.py synthesises random-weight models of the
# Qwen2.5-Coder-7B/0.5B shapes (--small: tiny ones), calibrates and predicts auto's speedup.
#   --cpu      CPU build even when a GPU is present      --small   tiny model shapes (rehearsal)
#   --dry-run  print the plan and commands, run nothing  --no-fa   skip the CUDA FlashAttention kernels (faster build)
#   --q8       Q8_0 weights instead of the Q4_K_M mix    --jobs N  build parallelism (default: all cores)
#   --arch N   CUDA for compute capability N without asking nvidia-smi (a compile rehearsal on a box with nvcc)
#   --build-only  stop after the build (build.log ends with the build's CPU time and its slowest steps)
# Env: PYTHON (default python3), WORK (build + models, default /tmp/localspec-gpu-check),
#      BUDGET_S (whole-run limit, default 530), BUILD_LIMIT_S (default 400), NICE (e.g. 19 on a shared box).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CPU=0 SMALL=0 DRY=0 FA=1 BUILD_ONLY=0 FORCE_ARCH="" RECIPE=q4_k_m JOBS=$(nproc 2>/dev/null || echo 4) OUTDIR=${OUT:-}
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) CPU=1 ;;
    --small) SMALL=1 ;;
    --dry-run) DRY=1 ;;
    --no-fa) FA=0 ;;
    --q8) RECIPE=q8_0 ;;
    --jobs) shift; JOBS=${1:?--jobs needs a number} ;;
    --jobs=*) JOBS=${1#--jobs=} ;;
    --arch) shift; FORCE_ARCH=${1:?--arch needs a compute capability, e.g. 90} ;;
    --build-only) BUILD_ONLY=1 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    -*) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) OUTDIR=$1 ;;
  esac
  shift
done
if [ -z "$OUTDIR" ]; then echo "error: give the output directory as an argument or \$OUT" >&2; exit 2; fi
case "$JOBS" in ''|*[!0-9]*) echo "error: --jobs takes a number" >&2; exit 2 ;; esac
case "$FORCE_ARCH" in *[!0-9]*) echo "error: --arch takes a compute capability without the dot, e.g. 90" >&2; exit 2 ;; esac
PY=${PYTHON:-python3}
WORK=${WORK:-/tmp/localspec-gpu-check}
BUDGET_S=${BUDGET_S:-530}
BUILD_LIMIT_S=${BUILD_LIMIT_S:-400}
SRC=$HERE/llama-cpp-python
LLAMA_SRC=$SRC/vendor/llama.cpp
BUILD=$WORK/build
START=$(date +%s)
NICE_CMD=()
[ -n "${NICE:-}" ] && NICE_CMD=(nice -n "$NICE")

# ---------------------------------------------------------------- backend
ARCH="" NVCC="" REASON=""
if [ "$CPU" = 1 ]; then
  BACKEND=cpu REASON="--cpu given"
else
  if command -v nvidia-smi >/dev/null 2>&1; then
    cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' .')
    case "$cap" in ''|*[!0-9]*) cap="" ;; esac
    ARCH=$cap
  fi
  REASON="nvidia-smi reports compute capability $ARCH"
  [ -n "$FORCE_ARCH" ] && ARCH=$FORCE_ARCH REASON="--arch $FORCE_ARCH given"
  if [ -n "$ARCH" ]; then
    BACKEND=cuda
    for c in "$(command -v nvcc 2>/dev/null)" "${CUDA_HOME:-/nonexistent}/bin/nvcc" /usr/local/cuda/bin/nvcc; do
      if [ -n "$c" ] && [ -x "$c" ]; then NVCC=$c; break; fi
    done
    if [ -z "$NVCC" ] && [ "$DRY" = 0 ]; then
      echo "error: an NVIDIA GPU is present but nvcc was not found (PATH, \$CUDA_HOME/bin, /usr/local/cuda/bin)" >&2
      echo "  fix: put CUDA's bin directory on PATH, or run with --cpu" >&2
      exit 1
    fi
    NVCC=${NVCC:-nvcc}
  else
    BACKEND=cpu REASON="no NVIDIA GPU found (nvidia-smi missing or reports none)"
  fi
fi

CMAKE_ARGS=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON
  -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF)
command -v ninja >/dev/null 2>&1 && CMAKE_ARGS=(-G Ninja "${CMAKE_ARGS[@]}")
# cuBLAS and the driver library. A toolkit assembled from pip wheels (nvcc + cudart, as on the
# borrowed box and here) has neither in its own tree: then cuBLAS comes from the nvidia-cublas wheel
# that PyTorch installs (site-packages/nvidia/cu13/{include,lib}), named to CMake outright (its
# libraries carry only versioned names), and libcuda from the driver (ldconfig) or, failing that,
# the build skips the one feature that links it (VMM memory pools).
CUBLAS_NOTE="" CUBLAS_LIB_DIR="" CUBLAS_MISSING=0
cuda_libs() {
  local top major found inc lib lt drv
  top=$("$NVCC" -v --dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n1)
  major=$("$NVCC" --version 2>/dev/null | sed -n 's/.*release \([0-9]*\)\..*/\1/p' | head -n1)
  for d in "${CUDA_HOME:-/nonexistent}" "${top:-/nonexistent}" /usr/local/cuda; do
    for i in "$d/include" "$d/targets/x86_64-linux/include"; do
      if [ -f "$i/cublas_v2.h" ]; then CUBLAS_NOTE="cuBLAS: the toolkit's ($i)"; break 2; fi
    done
  done
  if [ -z "$CUBLAS_NOTE" ]; then
    # Prefer the wheel built for nvcc's major version (nvidia/cu13 for CUDA 13), then any.
    found=$("$PY" - "$major" <<'PYEOF' 2>/dev/null
import glob, os, sys
major = sys.argv[1]
roots = [os.path.join(d, "nvidia", sub) for d in sys.path if d for sub in (f"cu{major}", "cu*", "cublas")]
for pattern in roots:
    for root in sorted(glob.glob(pattern)):
        libs = sorted(glob.glob(os.path.join(root, "lib", "libcublas.so*")))
        lts = sorted(glob.glob(os.path.join(root, "lib", "libcublasLt.so*")))
        if os.path.isfile(os.path.join(root, "include", "cublas_v2.h")) and libs and lts:
            print(root, libs[0], lts[0])
            sys.exit(0)
PYEOF
)
    if [ -n "$found" ]; then
      read -r inc lib lt <<<"$found"
      CMAKE_ARGS+=("-DCMAKE_CUDA_FLAGS=-I$inc/include" "-DCUDA_cublas_LIBRARY=$lib" "-DCUDA_cublasLt_LIBRARY=$lt")
      CUBLAS_LIB_DIR=$(dirname "$lib")
      CUBLAS_NOTE="cuBLAS: the pip wheel at $inc"
    else
      CUBLAS_MISSING=1
      CUBLAS_NOTE="cuBLAS: not found (no cublas_v2.h in the toolkit, no nvidia-cublas wheel on $PY's path)"
    fi
  fi
  drv=""
  [ -n "$top" ] && for f in "$top"/lib64/stubs/libcuda.so "$top"/targets/x86_64-linux/lib/stubs/libcuda.so; do
    [ -f "$f" ] && drv=toolkit
  done
  if [ -z "$drv" ]; then
    drv=$( { ldconfig -p 2>/dev/null | sed -n 's/.*libcuda\.so\.1 .*=> //p'
             ls /usr/local/nvidia/lib64/libcuda.so.1 /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib64/libcuda.so.1; } 2>/dev/null | head -n1)
    if [ -n "$drv" ]; then CMAKE_ARGS+=("-DCUDA_cuda_driver_LIBRARY=$drv"); CUBLAS_NOTE+="; libcuda: $drv"
    else CMAKE_ARGS+=(-DGGML_CUDA_NO_VMM=ON); CUBLAS_NOTE+="; libcuda: not found, so GGML_CUDA_NO_VMM=ON"; fi
  fi
}
if [ "$BACKEND" = cuda ]; then
  CMAKE_ARGS+=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$ARCH" "-DCMAKE_CUDA_COMPILER=$NVCC" -DGGML_CUDA_NCCL=OFF)
  [ "$FA" = 0 ] && CMAKE_ARGS+=(-DGGML_CUDA_FA=OFF)
  cuda_libs
fi
SHAPES="Qwen2.5-Coder-7B + 0.5B shapes"; [ "$SMALL" = 1 ] && SHAPES="small rehearsal shapes"
CHECK_ARGS=(--out "$OUTDIR" --work "$WORK/models" --vocab "$LLAMA_SRC/models/ggml-vocab-qwen2.gguf"
  --bench "$HERE/bench.json" --predicted-bench "$HERE/bench-predicted.json" --recipe "$RECIPE")
[ "$SMALL" = 1 ] && CHECK_ARGS+=(--small)
[ "$BACKEND" = cpu ] && CHECK_ARGS+=(--threads "$JOBS")

echo "backend: $BACKEND ($REASON); models: $SHAPES, $RECIPE; jobs: $JOBS"
[ -n "$CUBLAS_NOTE" ] && echo "$CUBLAS_NOTE"
echo "+ cmake -S $LLAMA_SRC -B $BUILD ${CMAKE_ARGS[*]}"
echo "+ cmake --build $BUILD --target llama -j $JOBS"
echo "+ cp $BUILD/bin/lib*.so* $SRC/llama_cpp/lib/"
echo "+ LLAMA_CPP_LIB_PATH=$SRC/llama_cpp/lib PYTHONPATH=$WORK/pylib:$SRC:$HERE:$HERE/localspec-src $PY $HERE/localspec-src/packaging/gpu_check.py ${CHECK_ARGS[*]}"
[ "$DRY" = 1 ] && exit 0

# ---------------------------------------------------------------- run
mkdir -p "$OUTDIR" "$WORK" || exit 1
exec > >(tee -a "$OUTDIR/check.log") 2>&1
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
fail() { echo "error: $*" >&2; echo "FAILED: $*" >>"$OUTDIR/summary.txt"; exit 1; }
[ -f "$LLAMA_SRC/CMakeLists.txt" ] || fail "no llama.cpp source at $LLAMA_SRC (run from an unpacked gpu bundle)"
[ "$CUBLAS_MISSING" = 0 ] || fail "$CUBLAS_NOTE; fix: pip install nvidia-cublas for $PY (PyTorch's CUDA wheels bring it), set CUDA_HOME to a full toolkit, or run with --cpu"
"$PY" -c 'import numpy' 2>/dev/null || fail "$PY has no numpy"
{ date; uname -a; "$PY" --version; cmake --version | head -1; [ -n "$NVCC" ] && "$NVCC" --version | tail -2
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version --format=csv; } \
  >"$OUTDIR/environment.txt" 2>&1

echo "== python deps (offline, from the bundled wheels, into $WORK/pylib)"
need=()
"$PY" -c 'import pydantic, sys; sys.exit(int(pydantic.VERSION.split(".")[0]) < 2)' 2>/dev/null || need+=(pydantic)
for m in diskcache jinja2 typing_extensions; do "$PY" -c "import $m" 2>/dev/null || need+=("${m//_/-}"); done
if [ ${#need[@]} -gt 0 ]; then
  "$PY" -m pip install --quiet --no-index --find-links "$HERE/wheels" --target "$WORK/pylib" "${need[@]}" \
    || fail "could not install ${need[*]} from $HERE/wheels"
fi

echo "== build llama.cpp ($BACKEND), log: $OUTDIR/build.log"
t=$(date +%s)
# A build dir configured from another unpacked bundle (or for another backend) is not reusable.
if [ -f "$BUILD/CMakeCache.txt" ] && { ! grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$LLAMA_SRC" "$BUILD/CMakeCache.txt" ||
     [ "$(grep -c '^GGML_CUDA:BOOL=ON' "$BUILD/CMakeCache.txt")" != "$([ "$BACKEND" = cuda ] && echo 1 || echo 0)" ]; }; then
  rm -rf "$BUILD"
fi
{ "${NICE_CMD[@]}" cmake -S "$LLAMA_SRC" -B "$BUILD" "${CMAKE_ARGS[@]}" &&
  timeout "$BUILD_LIMIT_S" "${NICE_CMD[@]}" cmake --build "$BUILD" --target llama -j "$JOBS"; } >"$OUTDIR/build.log" 2>&1
rc=$?
echo "build: exit $rc in $(( $(date +%s) - t )) s"
# What the build cost, for sizing the next one: compile seconds summed over steps, and the slowest.
if [ -f "$BUILD/.ninja_log" ]; then
  awk -F'\t' 'NR > 1 { s = ($2 - $1) / 1000; total += s; n++; print s "\t" $4 } END { printf "%.0f\tTOTAL (%d steps)\n", total, n }' \
    "$BUILD/.ninja_log" | sort -rn | head -n 13 | sed 's/^/ninja_log: /' >>"$OUTDIR/build.log"
fi
[ $rc = 0 ] || { tail -30 "$OUTDIR/build.log"; fail "llama.cpp build failed or passed ${BUILD_LIMIT_S}s (exit $rc; see build.log)"; }
mkdir -p "$SRC/llama_cpp/lib"
cp -a "$BUILD"/bin/lib*.so* "$SRC/llama_cpp/lib/" || fail "no libraries in $BUILD/bin"
ls "$SRC/llama_cpp/lib" >>"$OUTDIR/build.log"
[ "$BUILD_ONLY" = 1 ] && { echo "built in $(( $(date +%s) - START )) s (--build-only)"; exit 0; }

echo "== synthesise, calibrate, predict ($(left) s left)"
export LLAMA_CPP_LIB_PATH=$SRC/llama_cpp/lib
[ -n "$NVCC" ] && export LOCALSPEC_NVCC_VERSION="$("$NVCC" --version 2>/dev/null | tail -n1)"
[ -n "$CUBLAS_LIB_DIR" ] && export LD_LIBRARY_PATH=$CUBLAS_LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$WORK/pylib:$SRC:$HERE:$HERE/localspec-src${PYTHONPATH:+:$PYTHONPATH}
[ "$(left)" -gt 20 ] || fail "no time left for the measurement"
timeout "$(left)" "${NICE_CMD[@]}" "$PY" "$HERE/localspec-src/packaging/gpu_check.py" "${CHECK_ARGS[@]}"
rc=$?
[ $rc = 0 ] || fail "gpu_check.py exited with $rc (124: ran past the ${BUDGET_S}s budget)"
rm -rf "$WORK/models"   # GBs of random weights
echo "done in $(( $(date +%s) - START )) s; results in $OUTDIR"
