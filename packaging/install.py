#!/usr/bin/env python3
"""Build and install llama-cpp-python for this machine's hardware.

    python packaging/install.py [--backend auto|cuda|metal|cpu|vulkan|rocm] [--dry-run] [--python PY]

`auto` picks CUDA when an NVIDIA GPU and nvcc are both present (for the GPU's compute capability
where nvidia-smi reports it), Metal on Apple Silicon, else the CPU with its native instruction
set. Vulkan and ROCm are chosen only on request. pip's wheel cache ignores CMAKE_ARGS and would
silently reinstall a cached CPU build, hence --no-cache-dir --force-reinstall.

Standard library only: it must run before anything else is installed.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
BACKENDS = ("auto", "cuda", "metal", "cpu", "vulkan", "rocm")


@dataclass(frozen=True)
class Facts:
    """What the machine has; gathered by `detect()`, or given as data in tests."""

    system: str  # platform.system(): Linux, Darwin, Windows
    machine: str  # platform.machine(): x86_64, arm64, aarch64
    nvidia_gpus: tuple[str, ...] = ()  # GPU names from nvidia-smi
    compute_caps: tuple[str, ...] = ()  # "9.0", ... (nvidia-smi's compute_cap), where known
    tools: frozenset[str] = frozenset()  # on PATH: nvcc, cmake, cc/gcc/clang, c++, hipcc, glslc
    rocm_gpu_targets: tuple[str, ...] = ()  # gfx1100, ... from rocminfo, where known


@dataclass(frozen=True)
class Plan:
    backend: str
    cmake_args: list[str]
    reasons: list[str]
    missing: list[str] = field(default_factory=list)  # toolchain pieces that are absent, with the fix

    @property
    def env(self) -> dict[str, str]:
        return {"CMAKE_ARGS": " ".join(self.cmake_args)}


class ToolchainError(RuntimeError):
    pass


def _run_out(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def detect() -> Facts:
    tools = frozenset(t for t in ("nvcc", "nvidia-smi", "cmake", "cc", "gcc", "clang", "c++", "g++", "clang++",
                                  "hipcc", "rocminfo", "glslc", "ninja", "xcrun") if shutil.which(t))
    if "nvcc" not in tools and os.path.exists("/usr/local/cuda/bin/nvcc"):
        tools = tools | {"nvcc"}  # CUDA installs often leave nvcc off PATH; CMake finds it there
    names: list[str] = []
    caps: list[str] = []
    if "nvidia-smi" in tools:
        for line in _run_out(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"]).splitlines():
            parts = [p.strip() for p in line.split(",")]
            if parts and parts[0]:
                names.append(parts[0])
                if len(parts) > 1 and parts[1].replace(".", "").isdigit():
                    caps.append(parts[1])
    gfx: list[str] = []
    if "rocminfo" in tools:
        gfx = sorted({w for w in _run_out(["rocminfo"]).split() if w.startswith("gfx") and w[3:].isalnum()})
    return Facts(platform.system(), platform.machine(), tuple(names), tuple(caps), tools, tuple(gfx))


def _has_compiler(f: Facts) -> bool:
    return bool(f.tools & {"cc", "gcc", "clang"}) and bool(f.tools & {"c++", "g++", "clang++"})


def cuda_architectures(caps: tuple[str, ...]) -> str | None:
    """"9.0" -> "90"; several GPUs -> "86;90"; unknown -> None (CMake then builds its default set)."""
    archs = sorted({c.replace(".", "") for c in caps if c.replace(".", "").isdigit()}, key=int)
    return ";".join(archs) if archs else None


def plan(f: Facts, requested: str = "auto") -> Plan:
    """The backend and CMake flags for these facts. Pure: the tests feed it simulated machines."""
    if requested not in BACKENDS:
        raise ValueError(f"unknown backend {requested!r}; choose one of {', '.join(BACKENDS)}")
    reasons: list[str] = []
    backend = requested
    apple_silicon = f.system == "Darwin" and f.machine in ("arm64", "aarch64")
    if requested == "auto":
        if f.nvidia_gpus and "nvcc" in f.tools:
            backend = "cuda"
            reasons.append(f"NVIDIA GPU found ({', '.join(f.nvidia_gpus)}) and nvcc is installed")
        elif f.nvidia_gpus:
            backend = "cuda"  # still CUDA: the plan reports nvcc as missing instead of building for the CPU
            reasons.append(f"NVIDIA GPU found ({', '.join(f.nvidia_gpus)}), but nvcc is not installed")
        elif apple_silicon:
            backend = "metal"
            reasons.append("Apple Silicon: Metal runs on the built-in GPU")
        else:
            backend = "cpu"
            why = "no NVIDIA GPU reported by nvidia-smi" if "nvidia-smi" in f.tools else "nvidia-smi not found"
            if "nvcc" in f.tools:
                why += " (nvcc is installed, but without a visible GPU a CUDA build is not chosen; "
                why += "pass --backend cuda to force it)"
            reasons.append(f"{why}; not Apple Silicon: building for this CPU")
    else:
        reasons.append(f"--backend {requested} requested")

    missing: list[str] = []
    if "cmake" not in f.tools:
        missing.append("cmake: install it (`pip install cmake`, or your package manager's cmake)")
    if not _has_compiler(f) and not (apple_silicon and "xcrun" in f.tools):
        missing.append("a C/C++ compiler: install build-essential (Debian/Ubuntu), gcc-c++ (Fedora) or "
                       "the Xcode command line tools (`xcode-select --install`)")

    args: list[str] = []
    if backend == "cuda":
        args.append("-DGGML_CUDA=on")
        arch = cuda_architectures(f.compute_caps)
        if arch:
            args.append(f"-DCMAKE_CUDA_ARCHITECTURES={arch}")
            reasons.append(f"compute capability {', '.join(f.compute_caps)}: building for sm_{arch} only "
                           "(smaller and faster to build)")
        else:
            reasons.append("GPU compute capability unknown: CMake builds its default set of architectures")
        if "nvcc" not in f.tools:
            missing.append("nvcc (the CUDA toolkit): install it from https://developer.nvidia.com/cuda-downloads "
                           "and put its bin/ on PATH, or use --backend vulkan / cpu")
    elif backend == "metal":
        if f.system != "Darwin":
            missing.append("Metal: only available on macOS")
        args.append("-DGGML_METAL=on")
    elif backend == "cpu":
        args.append("-DGGML_NATIVE=on")
        reasons.append("GGML_NATIVE=on: uses every instruction set of this CPU (AVX2, AVX-512, NEON...); "
                       "the build will not run on older CPUs (see build-standalone.sh for a portable one)")
        if f.system == "Darwin":
            args.append("-DGGML_METAL=off")
    elif backend == "vulkan":
        args.append("-DGGML_VULKAN=on")
        if "glslc" not in f.tools:
            missing.append("glslc and the Vulkan SDK: install the LunarG Vulkan SDK or your distribution's "
                           "vulkan/glslc packages")
    elif backend == "rocm":
        args.append("-DGGML_HIP=on")
        if f.rocm_gpu_targets:
            args.append(f"-DAMDGPU_TARGETS={';'.join(f.rocm_gpu_targets)}")
            reasons.append(f"AMD GPU targets {', '.join(f.rocm_gpu_targets)} (from rocminfo)")
        if "hipcc" not in f.tools:
            missing.append("hipcc (ROCm): install ROCm from https://rocm.docs.amd.com and set "
                           "CC/CXX to its clang, HIPCXX=$(hipconfig -l)/clang")
    return Plan(backend, args, reasons, missing)


def pip_commands(python: str) -> list[list[str]]:
    """Rebuild llama-cpp-python alone (its dependencies keep their versions), then add any it lacks."""
    return [
        [python, "-m", "pip", "install", "--no-cache-dir", "--force-reinstall", "--no-deps", "--verbose",
         LLAMA_CPP_PYTHON],
        [python, "-m", "pip", "install", LLAMA_CPP_PYTHON],  # already satisfied: no rebuild, deps only
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=BACKENDS, default="auto")
    ap.add_argument("--dry-run", action="store_true", help="print the decision and commands; install nothing")
    ap.add_argument("--python", default=sys.executable, help="the Python whose environment gets llama-cpp-python")
    args = ap.parse_args(argv)

    facts = detect()
    p = plan(facts, args.backend)
    print(f"backend: {p.backend}")
    for r in p.reasons:
        print(f"  because: {r}")
    env_line = f"CMAKE_ARGS={shlex.quote(p.env['CMAKE_ARGS'])}"
    cmds = pip_commands(args.python)
    print(f"command: {env_line} {shlex.join(cmds[0])}")
    print(f"command: {shlex.join(cmds[1])}")
    if p.missing:
        print("error: the toolchain for this build is incomplete:", file=sys.stderr)
        for m in p.missing:
            print(f"  missing {m}", file=sys.stderr)
        return 2
    if args.dry_run:
        print("(dry run: nothing installed)")
        return 0
    print("building llama.cpp: this takes several minutes (more for CUDA)...", flush=True)
    for cmd in cmds:
        result = subprocess.run(cmd, env={**os.environ, **p.env}, check=False)
        if result.returncode != 0:
            print(f"error: pip failed with exit status {result.returncode}; its log is above.", file=sys.stderr)
            return result.returncode
    print(f"installed. Check it with: {os.path.dirname(args.python)}/localspec doctor")
    return 0


if __name__ == "__main__":
    sys.exit(main())
