#!/usr/bin/env bash
# Write the offline GPU cost-check bundle (< 60 MiB), run here (needs PyPI for the downloads):
#   packaging/gpu-bundle.sh [--prebuilt] [OUT_DIR]
#                                          (default /tmp/localspec-gpu-bundle -> OUT_DIR/localspec-gpu-check.tar.gz
#                                           and OUT_DIR/MANIFEST.txt, the bundle's file list)
#   --prebuilt  carry llama.cpp compiled here for CUDA sm_$PREBUILT_ARCH (default 90: H100/H200) beside its
#               source: no build on the GPU box unless they fail there. Needs nvcc here (the same major
#               version as there); cuBLAS's headers come from the nvidia-cublas wheel (downloaded). The
#               first such bundle compiles for ~18 minutes on 2 cores (an interrupted one resumes); the
#               libraries are cached in $PREBUILT_CACHE (default ~/.cache/localspec/gpu-prebuilt), keyed by
#               the llama-cpp-python and nvcc versions and the build's flags (gpu-check.sh --portable:
#               no -march=native, RUNPATH $ORIGIN).
#   BENCH_JSON=path/bench.json ...         acceptance profiles (default docs/bench/quick.json)
#   PREDICTED_BENCH_JSON=path/bench.json   Predicted Outputs' acceptance (default docs/bench/predicted.json)
# Contents: a trimmed llama.cpp source from the llama-cpp-python sdist (CPU + CUDA backends, the
# Qwen2 vocab-only GGUF for the synthetic models), the llama-cpp-python and gguf Python sources,
# localspec (with packaging/gpu_check.py and synth_gguf.py), wheels of the pure-Python/abi-tagged
# deps the engine imports that a PyTorch box may lack (pinned to this venv's versions), the bench
# JSON, and gpu-check.sh at the top. On the GPU box: tar xzf ...; bash gpu-check.sh OUT_DIR
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
PREBUILT=0 OUT=/tmp/localspec-gpu-bundle
for a in "$@"; do case "$a" in --prebuilt) PREBUILT=1 ;; -*) echo "error: unknown option $a" >&2; exit 2 ;; *) OUT=$a ;; esac; done
PY=${PYTHON:-$REPO/.venv/bin/python}
command -v "$PY" >/dev/null || { echo "error: no Python at $PY; fix: make the README's venv in $REPO, or set PYTHON to one with localspec's deps" >&2; exit 2; }
VERSION=0.3.36
LIMIT=$((60 * 1024 * 1024))
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
stage=$work/bundle
mkdir -p "$stage/wheels" "$OUT"
OUT=$(cd "$OUT" && pwd)
ver() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }

echo "== llama-cpp-python $VERSION sdist"
"$PY" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$work/sdist"
tar xzf "$work"/sdist/llama_cpp_python-$VERSION.tar.gz -C "$work"
src=$work/llama_cpp_python-$VERSION
ll=$src/vendor/llama.cpp
# Trim what a CPU/CUDA library build never reads: other backends, docs, tests, CI, web UI, and
# every vocab model but Qwen2's (the synthetic models' tokenizer).
mv "$ll/models/ggml-vocab-qwen2.gguf" "$work/"
rm -rf "$ll"/{docs,media,.github,.devops,scripts,benches,grammars,prompts,requirements,ci,pocs,licenses,tests,examples} \
       "$ll"/models "$ll"/tools/server/public* "$ll"/tools/server/webui \
       "$src"/.git "$src"/docs "$src"/examples "$src"/tests
mkdir -p "$ll/models" && mv "$work/ggml-vocab-qwen2.gguf" "$ll/models/"
for b in sycl vulkan metal cann opencl musa kompute rpc blas webgpu zdnn hexagon openvino et virtgpu zendnn; do rm -rf "$ll/ggml/src/ggml-$b"; done
mv "$src" "$stage/llama-cpp-python"
if [ -d "$stage/llama-cpp-python/vendor/llama.cpp/gguf-py/gguf" ]; then
  cp -r "$stage/llama-cpp-python/vendor/llama.cpp/gguf-py/gguf" "$stage/gguf"
else
  cp -r "$("$PY" -c 'import gguf, os; print(os.path.dirname(gguf.__file__))')" "$stage/gguf"
fi

echo "== localspec"
mkdir -p "$stage/localspec-src"
(cd "$REPO" && tar cf - --exclude=__pycache__ localspec packaging models.toml pyproject.toml README.md) | tar xf - -C "$stage/localspec-src"
cp "$REPO/packaging/gpu-check.sh" "$stage/gpu-check.sh"

echo "== wheels the engine imports that a PyTorch box may lack (pinned; py3.10-3.13, manylinux x86_64)"
"$PY" -m pip download --quiet --no-deps -d "$stage/wheels" "diskcache==$(ver diskcache)" \
  "typing-extensions==$(ver typing-extensions)" "annotated-types==$(ver annotated-types)" \
  "typing-inspection==$(ver typing-inspection)" "pydantic==$(ver pydantic)" "jinja2==$(ver jinja2)" \
  "platformdirs==$(ver platformdirs)"
# pyyaml for gguf-py (gguf.metadata imports yaml), which localspec.models reads headers with.
for v in 3.10 3.11 3.12 3.13; do
  "$PY" -m pip download --quiet --no-deps --only-binary :all: --platform manylinux2014_x86_64 \
    --python-version "$v" -d "$stage/wheels" "pydantic-core==$(ver pydantic-core)" "markupsafe==$(ver markupsafe)" \
    "pyyaml==$(ver pyyaml)"
done

echo "== acceptance profiles"
bench=${BENCH_JSON:-$REPO/docs/bench/quick.json}
if [ -f "$bench" ]; then cp "$bench" "$stage/bench.json"; echo "using $bench"
else echo "no bench JSON at $bench: no acceptance profiles bundled"; fi
predicted=${PREDICTED_BENCH_JSON:-$REPO/docs/bench/predicted.json}
if [ -f "$predicted" ]; then cp "$predicted" "$stage/bench-predicted.json"; echo "using $predicted"
else echo "no predicted bench JSON at $predicted: no Predicted Outputs estimate"; fi

if [ "$PREBUILT" = 1 ]; then
  arch=${PREBUILT_ARCH:-90}
  nvcc_release=$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\),.*/\1/p') ||
    { echo "error: --prebuilt needs nvcc here" >&2; exit 1; }
  [ -n "$nvcc_release" ] || { echo "error: --prebuilt needs nvcc here (CUDA's bin directory on PATH)" >&2; exit 1; }
  # The build's flags (paths left out) are part of the key: new flags in gpu-check.sh mean a new build.
  flags=$(PYTHONPATH='' bash "$stage/gpu-check.sh" --dry-run --arch "$arch" --portable /nonexistent |
          sed -n 's/^+ cmake -S [^ ]* -B [^ ]* //p' | tr ' ' '\n' | grep -v / | sort | tr '\n' ' ')
  key=$(printf %s "$flags" | sha256sum | cut -c1-8)
  cache=${PREBUILT_CACHE:-$HOME/.cache/localspec/gpu-prebuilt}/llama-cpp-python-$VERSION-sm$arch-cuda$nvcc_release-$key
  if [ ! -f "$cache/BUILD_INFO" ]; then
    echo "== compile llama.cpp for CUDA sm_$arch with nvcc $nvcc_release (once; cached in $cache)"
    "$PY" -m pip download --quiet --no-deps --only-binary :all: --platform manylinux_2_27_x86_64 \
      --platform manylinux2014_x86_64 --python-version 3.12 -d "$work/cublas" "nvidia-cublas==$nvcc_release.*"
    (cd "$work/cublas" && "$PY" -m zipfile -e nvidia_cublas-*.whl pip)
    # The sources and the build dir outlive this script at a fixed path (an interrupted compile
    # resumes: ninja keys on the paths and times) and go once the libraries are cached.
    mkdir -p "$cache.work"
    [ -d "$cache.work/bundle" ] || cp -a "$stage" "$cache.work/bundle"
    PYTHONPATH=$work/cublas/pip PYTHON=$PY WORK=$cache.work BUILD_LIMIT_S=${PREBUILD_LIMIT_S:-7200} BUDGET_S=7300 \
      bash "$cache.work/bundle/gpu-check.sh" --arch "$arch" --portable --build-only "$work/prebuild-out" ||
      { tail -40 "$work/prebuild-out/build.log" >&2; exit 1; }
    rm -rf "$cache.tmp" && mkdir -p "$cache.tmp"
    cp -a "$cache".work/build/bin/lib*.so* "$cache.tmp/"
    { echo "llama-cpp-python $VERSION compiled for CUDA sm_$arch (SASS only) with nvcc $nvcc_release, no -march=native, on $(hostname) $(date -u +%F)"
      echo "arch=$arch"; echo "cuda_major=${nvcc_release%%.*}"; echo "flags=$flags"; } >"$cache.tmp/BUILD_INFO"
    rm -rf "$cache" && mv "$cache.tmp" "$cache" && rm -rf "$cache.work"
  fi
  echo "== prebuilt libraries from $cache (the source stays, for a build there if they fail)"
  mkdir -p "$stage/prebuilt"
  cp -a "$cache"/. "$stage/prebuilt/"
  rm -f "$stage"/llama-cpp-python/llama_cpp/lib/lib*.so*
fi

(cd "$stage" && find . -type f -printf '%s\t%P\n' | sort -k2) >"$stage/MANIFEST.txt"
cp "$stage/MANIFEST.txt" "$OUT/MANIFEST.txt"
tarball=$OUT/localspec-gpu-check.tar.gz
tar czf "$tarball" -C "$stage" .
size=$(stat -c %s "$tarball")
echo "wrote $tarball: $((size / 1024 / 1024)) MiB ($size bytes), $(wc -l <"$OUT/MANIFEST.txt") files"
if [ "$size" -ge "$LIMIT" ]; then echo "error: bundle is over 60 MiB" >&2; exit 1; fi
# The device tool carries at most 64 MiB per call: the repository's files that git does not ignore,
# and the bundle.
repo=$(cd "$REPO" && git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null |
       awk '{s += $1} END {print s + 0}') || true
echo "a device call carrying it with the repository ($((repo / 1024 / 1024)) MiB): $(((size + repo) / 1024 / 1024)) MiB of 64"
if [ $((size + repo)) -ge $((64 * 1024 * 1024)) ]; then
  echo "error: over the device tool's 64 MiB; fix: the source bundle (without --prebuilt), or fewer files in the repository" >&2
  exit 1
fi
