#!/usr/bin/env bash
# Build llama.cpp's llama-server from the llama.cpp vendored in the pinned llama-cpp-python sdist,
# so `localspec bench` compares against the same llama.cpp build our engine links (issue #31).
#
#   scripts/build_llama_server.sh            # then: export LLAMA_SERVER=<the path it prints>
#
# Environment (all optional):
#   PYTHON                    the interpreter whose llama_cpp pins the version (default: python3)
#   LLAMA_CPP_PYTHON_VERSION  build this version instead of the installed llama_cpp.__version__
#   LOCALSPEC_BUILD_CACHE     where the sdist, its sources and the build live
#                             (default: ${XDG_CACHE_HOME:-~/.cache}/localspec/llama-server)
#   JOBS                      parallel compile jobs (default: nproc)
#
# Idempotent: a version already built is only reported. Needs cmake and a C++ compiler; no network
# beyond the package index (LLAMA_CURL=OFF: the server never downloads models).
set -euo pipefail

PYTHON=${PYTHON:-python3}
version=${LLAMA_CPP_PYTHON_VERSION:-$("$PYTHON" -c 'import llama_cpp; print(llama_cpp.__version__)')}
cache=${LOCALSPEC_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/localspec/llama-server}
jobs=${JOBS:-$(nproc)}
src="$cache/llama_cpp_python-$version"
build="$src/build"
binary="$build/bin/llama-server"

if [[ -x "$binary" ]]; then
    echo "llama-server for llama-cpp-python $version is already built: $binary" >&2
else
    mkdir -p "$cache"
    sdist="$cache/llama_cpp_python-$version.tar.gz"
    if [[ ! -f "$sdist" ]]; then
        # --no-binary: the source distribution, which carries llama.cpp under vendor/.
        "$PYTHON" -m pip download --no-binary :all: --no-deps --dest "$cache" "llama-cpp-python==$version" >&2
    fi
    if [[ ! -d "$src/vendor/llama.cpp" ]]; then
        tar -xzf "$sdist" -C "$cache"
    fi
    # GGML_NATIVE: tuned for this CPU, as a local pip build of llama-cpp-python is.
    cmake -S "$src/vendor/llama.cpp" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON \
        -DLLAMA_BUILD_TESTS=OFF >&2
    cmake --build "$build" --target llama-server -j "$jobs" >&2
    if [[ ! -x "$binary" ]]; then
        echo "the build finished but $binary is missing" >&2
        exit 1
    fi
fi

echo "$binary"
echo "export LLAMA_SERVER=$binary"
