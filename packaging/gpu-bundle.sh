#!/usr/bin/env bash
# Write the offline GPU cost-check bundle (< 60 MiB): a trimmed llama.cpp source from the
# llama-cpp-python sdist, the llama-cpp-python and gguf Python sources, localspec itself, the wheels
# of the few pure-Python/abi-tagged deps the engine needs, and a bench JSON of acceptance profiles.
#   packaging/gpu-bundle.sh [OUT_DIR]        (default: ./gpu-bundle; writes OUT_DIR/localspec-gpu-check.tar.gz)
#   BENCH_JSON=bench-out/bench.json packaging/gpu-bundle.sh   (acceptance profiles measured with the real pair)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-$REPO/gpu-bundle}
PY=${PYTHON:-$REPO/.venv/bin/python}
VERSION=0.3.36
LIMIT=$((60 * 1024 * 1024))
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
stage=$work/bundle
mkdir -p "$stage/wheels" "$OUT"

echo "== llama-cpp-python $VERSION sdist"
"$PY" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$work/sdist"
tar xzf "$work"/sdist/llama_cpp_python-$VERSION.tar.gz -C "$work"
src=$work/llama_cpp_python-$VERSION
ll=$src/vendor/llama.cpp
# Trim what a CUDA/CPU library build never reads: other backends, docs, vocab models, tests, CI.
rm -rf "$ll"/{docs,media,.github,.devops,scripts,benches,grammars,prompts,requirements,ci,pocs,licenses} \
       "$ll"/models "$ll"/tools/server/public* "$ll"/tools/server/webui \
       "$src"/.git "$src"/docs "$src"/examples "$src"/tests
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

echo "== wheels the engine imports that a PyTorch machine may lack (py3.10-3.13, manylinux x86_64)"
"$PY" -m pip download --quiet --no-deps -d "$stage/wheels" diskcache typing-extensions annotated-types \
  typing-inspection pydantic scikit-build-core pathspec packaging
for v in 3.10 3.11 3.12 3.13; do
  "$PY" -m pip download --quiet --no-deps --only-binary :all: --platform manylinux2014_x86_64 \
    --python-version "$v" -d "$stage/wheels" "pydantic-core==$("$PY" -c 'import pydantic_core; print(pydantic_core.__version__)')"
done

echo "== acceptance profiles"
bench=${BENCH_JSON:-$REPO/bench-out/bench.json}
if [ -f "$bench" ]; then cp "$bench" "$stage/bench.json"; echo "using $bench"
else echo "no bench JSON at $bench: no acceptance profiles bundled"; fi
for f in gpu-check.sh gpu_check.py; do [ -f "$REPO/packaging/$f" ] && cp "$REPO/packaging/$f" "$stage/"; done
true

tarball=$OUT/localspec-gpu-check.tar.gz
tar czf "$tarball" -C "$stage" .
size=$(stat -c %s "$tarball")
echo "wrote $tarball: $((size / 1024 / 1024)) MiB ($size bytes)"
if [ "$size" -ge "$LIMIT" ]; then echo "error: bundle is over 60 MiB" >&2; exit 1; fi
