#!/usr/bin/env bash
# GPU cost check, run unattended from an unpacked gpu-bundle (offline; < 9 minutes).
#   bash gpu-check.sh [--cpu] [--small] [--dry-run] [--no-fa] [--q8] [--jobs N] [--arch N] [--portable]
#                     [--from-source] [--build-only] [OUT_DIR]
# OUT_DIR (or $OUT) receives everything: environment.txt, build.log, check.log, calibration.json,
# predictions.json, engine.json, summary.txt. The llama.cpp libraries: a bundle made with
# `gpu-bundle.sh --prebuilt` carries them compiled for CUDA sm_90 (prebuilt/); they are used when
# they load and see the GPU, else (or with --from-source, or --cpu) llama.cpp is built from the
# bundled source with cmake: CUDA for the local GPU's architecture only (nvidia-smi compute_cap,
# e.g. 90 on an H200), or the CPU with --cpu / when no NVIDIA GPU is found. The libraries go into
# the bundled llama_cpp/lib (LLAMA_CPP_LIB_PATH points there), so the bundled pure-Python
# llama-cpp-python loads them. Then gpu_check.py synthesises random-weight models of the
# Qwen2.5-Coder-7B/0.5B shapes (--small: tiny ones) and measures (packaging/README.md).
#   --cpu      CPU build even when a GPU is present      --small   tiny model shapes (rehearsal)
#   --dry-run  print the plan and commands, run nothing  --no-fa   skip the CUDA FlashAttention kernels (faster build)
#   --q8       Q8_0 weights instead of the Q4_K_M mix    --jobs N  build parallelism (default: all cores)
#   --arch N   CUDA for compute capability N without asking nvidia-smi (a compile rehearsal on a box with nvcc)
#   --portable no -march=native (GGML_NATIVE=OFF: AVX2/FMA/F16C) and RUNPATH $ORIGIN, for libraries built here
#              and run elsewhere
#   --from-source  build even when prebuilt libraries are bundled
#   --build-only   stop after the build (build.log ends with the build's CPU time and its slowest steps)
# Env: PYTHON (default python3), WORK (build + models, default /tmp/localspec-gpu-check),
#      BUDGET_S (whole-run limit, default 530), BUILD_LIMIT_S (default 400), NICE (e.g. 19 on a shared box),
#      CUDA_DEFAULT (where a toolkit is looked for after PATH and CUDA_HOME, default /usr/local/cuda).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CPU=0 SMALL=0 DRY=0 FA=1 BUILD_ONLY=0 FORCE_ARCH="" NATIVE=ON FROM_SOURCE=0 RECIPE=q4_k_m
JOBS=$(nproc 2>/dev/null || echo 4) OUTDIR=${OUT:-}
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
    --portable) NATIVE=OFF ;;
    --from-source) FROM_SOURCE=1 ;;
    --build-only) BUILD_ONLY=1 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    -*) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) OUTDIR=$1 ;;
  esac
  shift
done
if [ -z "$OUTDIR" ]; then echo "error: give the output directory as an argument or \$OUT" >&2; exit 2; fi
case "$JOBS" in ''|*[!0-9]*) echo "error: --jobs takes a number" >&2; exit 2 ;; esac
case "$FORCE_ARCH" in *[!0-9]*) echo "error: --arch takes a compute capability without the dot, e.g. 90" >&2; exit 2 ;; esac
[ "$BUILD_ONLY" = 1 ] && FROM_SOURCE=1
PY=${PYTHON:-python3}
CUDA_DEFAULT=${CUDA_DEFAULT:-/usr/local/cuda}
WORK=${WORK:-/tmp/localspec-gpu-check}
BUDGET_S=${BUDGET_S:-530}
BUILD_LIMIT_S=${BUILD_LIMIT_S:-400}
SRC=$HERE/llama-cpp-python
LLAMA_SRC=$SRC/vendor/llama.cpp
VOCAB=$HERE/ggml-vocab-qwen2.gguf
[ -f "$VOCAB" ] || VOCAB=$LLAMA_SRC/models/ggml-vocab-qwen2.gguf
PREBUILT=$HERE/prebuilt
BUILD=$WORK/build
START=$(date +%s)
NICE_CMD=()
[ -n "${NICE:-}" ] && NICE_CMD=(nice -n "$NICE")

# ---------------------------------------------------------------- backend
ARCH="" NVCC="" REASON="" GPU_SEEN=0
if [ "$CPU" = 1 ]; then
  BACKEND=cpu REASON="--cpu given"
else
  if command -v nvidia-smi >/dev/null 2>&1; then
    cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' .')
    case "$cap" in ''|*[!0-9]*) cap="" ;; esac
    ARCH=$cap
    [ -n "$cap" ] && GPU_SEEN=1
  fi
  REASON="nvidia-smi reports compute capability $ARCH"
  [ -n "$FORCE_ARCH" ] && ARCH=$FORCE_ARCH REASON="--arch $FORCE_ARCH given"
  if [ -n "$ARCH" ]; then
    BACKEND=cuda
    for c in "$(command -v nvcc 2>/dev/null)" "${CUDA_HOME:-/nonexistent}/bin/nvcc" "$CUDA_DEFAULT/bin/nvcc"; do
      if [ -n "$c" ] && [ -x "$c" ]; then NVCC=$c; break; fi
    done
  else
    BACKEND=cpu REASON="no NVIDIA GPU found (nvidia-smi missing or reports none)"
  fi
fi
# Prebuilt CUDA libraries, if the bundle has them for this architecture; the source stays the fallback.
USE_PREBUILT=0 PREBUILT_INFO=""
if [ "$BACKEND" = cuda ] && [ "$FROM_SOURCE" = 0 ] && [ -f "$PREBUILT/BUILD_INFO" ]; then
  PREBUILT_INFO=$(head -n1 "$PREBUILT/BUILD_INFO")
  if grep -qx "arch=$ARCH" "$PREBUILT/BUILD_INFO"; then USE_PREBUILT=1
  else PREBUILT_INFO="$PREBUILT_INFO (not for compute capability $ARCH: building)"; fi
fi
HAVE_SOURCE=0; [ -f "$LLAMA_SRC/CMakeLists.txt" ] && HAVE_SOURCE=1
if [ "$BACKEND" = cuda ] && [ -z "$NVCC" ] && [ "$USE_PREBUILT" = 0 ] && [ "$DRY" = 0 ]; then
  echo "error: an NVIDIA GPU is present but nvcc was not found (PATH, \$CUDA_HOME/bin, $CUDA_DEFAULT/bin)" >&2
  echo "  fix: put CUDA's bin directory on PATH, bundle prebuilt libraries (gpu-bundle.sh --prebuilt), or run with --cpu" >&2
  exit 1
fi

CMAKE_ARGS=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON "-DGGML_NATIVE=$NATIVE"
  -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF)
command -v ninja >/dev/null 2>&1 && CMAKE_ARGS=(-G Ninja "${CMAKE_ARGS[@]}")
# Libraries that travel find each other beside themselves, not in this box's build dir.
[ "$NATIVE" = OFF ] && CMAKE_ARGS+=(-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN')
# cuBLAS, cudart and the driver library. A toolkit assembled from pip wheels (nvcc + cudart, as on
# the borrowed box and here) has no cuBLAS in its own tree: then cuBLAS comes from the nvidia-cublas
# wheel that PyTorch installs (site-packages/nvidia/cu13/{include,lib}), named to CMake outright
# (its libraries carry only versioned names), and libcuda from the driver (ldconfig) or, failing
# that, the build skips the one feature that links it (VMM memory pools). CUDA_LIB_PATH is where
# the libraries are found at run time (prebuilt ones were linked on another box).
CUBLAS_NOTE="" CUDA_LIB_PATH="" CUBLAS_MISSING=0
cuda_libs() {
  local top="" major found inc lib lt drv
  if [ -n "$NVCC" ]; then
    top=$("$NVCC" -v --dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n1)
    major=$("$NVCC" --version 2>/dev/null | sed -n 's/.*release \([0-9]*\)\..*/\1/p' | head -n1)
  else
    major=$(sed -n 's/^cuda_major=//p' "$PREBUILT/BUILD_INFO" 2>/dev/null)
  fi
  for d in "${CUDA_HOME:-/nonexistent}" "${top:-/nonexistent}" "$CUDA_DEFAULT"; do
    for l in "$d/lib64" "$d/lib" "$d/targets/x86_64-linux/lib"; do [ -d "$l" ] && CUDA_LIB_PATH+=${CUDA_LIB_PATH:+:}$l; done
    # CMake finds a toolkit's cuBLAS by its header and its unversioned library, both in the tree.
    for i in "$d/include" "$d/targets/x86_64-linux/include"; do
      if [ -f "$i/cublas_v2.h" ] && ls "$d"/lib64/libcublas.so "$d"/lib/libcublas.so \
           "$d"/targets/x86_64-linux/lib/libcublas.so >/dev/null 2>&1; then
        CUBLAS_NOTE="cuBLAS: the toolkit's ($i)"; break 2
      fi
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
        if libs and lts:  # the header as well, for a build; prebuilt libraries need only these
            print(root, libs[0], lts[0], int(os.path.isfile(os.path.join(root, "include", "cublas_v2.h"))))
            sys.exit(0)
PYEOF
)
    if [ -n "$found" ]; then
      read -r inc lib lt header <<<"$found"
      CMAKE_ARGS+=("-DCMAKE_CUDA_FLAGS=-I$inc/include" "-DCUDA_cublas_LIBRARY=$lib" "-DCUDA_cublasLt_LIBRARY=$lt")
      CUDA_LIB_PATH=$(dirname "$lib")${CUDA_LIB_PATH:+:$CUDA_LIB_PATH}
      CUBLAS_NOTE="cuBLAS: the pip wheel at $inc"
      [ "$header" = 1 ] || { [ "$USE_PREBUILT" = 1 ] || CUBLAS_MISSING=1; CUBLAS_NOTE+=" (its libraries only: no cublas_v2.h to build with)"; }
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
  # SASS for this architecture only (-real: no PTX beside it, a smaller library); FlashAttention's
  # vector kernels for the f16 KV cache the engine uses only (llama.cpp's default also builds q4_0,
  # q8_0 and bf16 KV), to shorten the build.
  CMAKE_ARGS+=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$ARCH-real" "-DCMAKE_CUDA_COMPILER=${NVCC:-nvcc}"
    -DGGML_CUDA_NCCL=OFF -DGGML_CUDA_FA_QUANTS=f16-f16)
  [ "$FA" = 0 ] && CMAKE_ARGS+=(-DGGML_CUDA_FA=OFF)
  cuda_libs
fi
SHAPES="Qwen2.5-Coder-7B + 0.5B shapes"; [ "$SMALL" = 1 ] && SHAPES="small rehearsal shapes"
CHECK_ARGS=(--out "$OUTDIR" --work "$WORK/models" --vocab "$VOCAB"
  --bench "$HERE/bench.json" --predicted-bench "$HERE/bench-predicted.json" --recipe "$RECIPE")
[ "$SMALL" = 1 ] && CHECK_ARGS+=(--small)
[ "$BACKEND" = cpu ] && CHECK_ARGS+=(--threads "$JOBS")

echo "backend: $BACKEND ($REASON); models: $SHAPES, $RECIPE; jobs: $JOBS"
[ -n "$CUBLAS_NOTE" ] && echo "$CUBLAS_NOTE"
[ -n "$PREBUILT_INFO" ] && echo "prebuilt: $PREBUILT_INFO"
if [ "$USE_PREBUILT" = 1 ]; then
  echo "+ cp $PREBUILT/lib*.so* $SRC/llama_cpp/lib/   (if they load and see the GPU; else the build below)"
fi
echo "+ cmake -S $LLAMA_SRC -B $BUILD ${CMAKE_ARGS[*]}"
echo "+ cmake --build $BUILD --target llama -j $JOBS"
echo "+ cp $BUILD/bin/lib*.so* $SRC/llama_cpp/lib/"
echo "+ LLAMA_CPP_LIB_PATH=$SRC/llama_cpp/lib PYTHONPATH=$WORK/pylib:$SRC:$HERE:$HERE/localspec-src $PY $HERE/localspec-src/packaging/gpu_check.py ${CHECK_ARGS[*]}"
[ "$DRY" = 1 ] && exit 0

# ---------------------------------------------------------------- run
mkdir -p "$OUTDIR" "$WORK" || exit 1
exec > >(tee -a "$OUTDIR/check.log") 2>&1
TEE_PID=$!
# The device tool ends what a command leaves running: let tee write its last lines first.
trap 'exec >&- 2>&-; wait "$TEE_PID" 2>/dev/null' EXIT
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
fail() { echo "error: $*" >&2; echo "FAILED: $*" >>"$OUTDIR/summary.txt"; exit 1; }
[ "$USE_PREBUILT" = 1 ] || [ "$HAVE_SOURCE" = 1 ] ||
  fail "no llama.cpp source at $LLAMA_SRC and no prebuilt libraries for this backend (run from an unpacked gpu bundle)"
[ "$CUBLAS_MISSING" = 0 ] || fail "$CUBLAS_NOTE; fix: pip install nvidia-cublas for $PY (PyTorch's CUDA wheels bring it), set CUDA_HOME to a full toolkit, or run with --cpu"
"$PY" -c 'import numpy' 2>/dev/null || fail "$PY has no numpy"
{ date; uname -a; "$PY" --version; cmake --version | head -1; [ -n "$NVCC" ] && "$NVCC" --version | tail -2
  [ -n "$PREBUILT_INFO" ] && echo "prebuilt: $PREBUILT_INFO"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version --format=csv; } \
  >"$OUTDIR/environment.txt" 2>&1

echo "== python deps (offline, from the bundled wheels, into $WORK/pylib)"
export PYTHONPATH=$WORK/pylib:$SRC:$HERE:$HERE/localspec-src${PYTHONPATH:+:$PYTHONPATH}  # a rerun finds them there
need=()
"$PY" -c 'import pydantic, sys; sys.exit(int(pydantic.VERSION.split(".")[0]) < 2)' 2>/dev/null || need+=(pydantic)
# module:package; platformdirs and yaml for localspec.models (the offload plan reads model headers).
for m in diskcache:diskcache jinja2:jinja2 typing_extensions:typing-extensions platformdirs:platformdirs yaml:pyyaml; do
  "$PY" -c "import ${m%%:*}" 2>/dev/null || need+=("${m#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  "$PY" -m pip install --quiet --no-index --find-links "$HERE/wheels" --target "$WORK/pylib" "${need[@]}" \
    || fail "could not install ${need[*]} from $HERE/wheels"
fi
export LLAMA_CPP_LIB_PATH=$SRC/llama_cpp/lib
# The libraries' own directory first: prebuilt ones were linked with RUNPATHs of a build dir elsewhere.
export LD_LIBRARY_PATH=$LLAMA_CPP_LIB_PATH${CUDA_LIB_PATH:+:$CUDA_LIB_PATH}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$SRC/llama_cpp/lib"

if [ "$USE_PREBUILT" = 1 ]; then
  echo "== prebuilt libraries: $PREBUILT_INFO"
  cp -a "$PREBUILT"/lib*.so* "$SRC/llama_cpp/lib/" || fail "could not copy $PREBUILT"
  # They must load here and, where nvidia-smi saw a GPU, offload to it.
  why=$(timeout 90 "$PY" -c 'import sys, llama_cpp; sys.exit(0 if llama_cpp.llama_supports_gpu_offload() or sys.argv[1] == "0" else 3)' \
        "$GPU_SEEN" 2>&1 | tail -n 1)
  rc=$?
  if [ $rc = 0 ]; then
    echo "the prebuilt libraries load$([ "$GPU_SEEN" = 1 ] && echo " and offload to the GPU")" | tee -a "$OUTDIR/build.log"
  else
    [ -z "$why" ] && why=$([ $rc = 124 ] && echo "loading them took over 90 s" || echo "they load but see no GPU")
    echo "the prebuilt libraries failed here: $why" | tee -a "$OUTDIR/build.log"
    [ "$HAVE_SOURCE" = 1 ] && [ -n "$NVCC" ] ||
      fail "the prebuilt libraries failed here ($why); fix: carry a source bundle (gpu-bundle.sh without --prebuilt) and run again"
    rm -f "$SRC"/llama_cpp/lib/lib*.so*
    USE_PREBUILT=0
  fi
fi

if [ "$USE_PREBUILT" = 0 ]; then
  echo "== build llama.cpp ($BACKEND), log: $OUTDIR/build.log"
  t=$(date +%s)
  # A build dir configured from another unpacked bundle (or for another backend) is not reusable.
  if [ -f "$BUILD/CMakeCache.txt" ] && { ! grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$LLAMA_SRC" "$BUILD/CMakeCache.txt" ||
       [ "$(grep -c '^GGML_CUDA:BOOL=ON' "$BUILD/CMakeCache.txt")" != "$([ "$BACKEND" = cuda ] && echo 1 || echo 0)" ]; }; then
    rm -rf "$BUILD"
  fi
  { "${NICE_CMD[@]}" cmake -S "$LLAMA_SRC" -B "$BUILD" "${CMAKE_ARGS[@]}" &&
    timeout "$BUILD_LIMIT_S" "${NICE_CMD[@]}" cmake --build "$BUILD" --target llama -j "$JOBS"; } >>"$OUTDIR/build.log" 2>&1
  rc=$?
  echo "build: exit $rc in $(( $(date +%s) - t )) s"
  # What the build cost, for sizing the next one: compile seconds summed over steps, and the slowest.
  if [ -f "$BUILD/.ninja_log" ]; then
    awk -F'\t' 'NR > 1 { s = ($2 - $1) / 1000; total += s; n++; print s "\t" $4 } END { printf "%.0f\tTOTAL (%d steps)\n", total, n }' \
      "$BUILD/.ninja_log" | sort -rn | head -n 13 | sed 's/^/ninja_log: /' >>"$OUTDIR/build.log"
  fi
  [ $rc = 0 ] || { tail -30 "$OUTDIR/build.log"; fail "llama.cpp build failed or passed ${BUILD_LIMIT_S}s (exit $rc; see build.log)"; }
  cp -a "$BUILD"/bin/lib*.so* "$SRC/llama_cpp/lib/" || fail "no libraries in $BUILD/bin"
  ls "$SRC/llama_cpp/lib" >>"$OUTDIR/build.log"
  [ "$BUILD_ONLY" = 1 ] && { echo "built in $(( $(date +%s) - START )) s (--build-only)"; exit 0; }
fi

echo "== synthesise, calibrate, predict ($(left) s left)"
[ -n "$NVCC" ] && export LOCALSPEC_NVCC_VERSION="$("$NVCC" --version 2>/dev/null | tail -n1)"
[ "$(left)" -gt 20 ] || fail "no time left for the measurement"
timeout "$(left)" "${NICE_CMD[@]}" "$PY" "$HERE/localspec-src/packaging/gpu_check.py" "${CHECK_ARGS[@]}" \
  --deadline-s "$(( $(left) - 5 ))"
rc=$?
[ $rc = 0 ] || fail "gpu_check.py exited with $rc (124: ran past the ${BUDGET_S}s budget)"
rm -rf "$WORK/models"   # GBs of random weights
echo "done in $(( $(date +%s) - START )) s; results in $OUTDIR"
