"""Packaging: install.py's backend decision and dry run, service units, the GPU cost check (dry runs,
synthetic models, predictions) and the opt-in standalone-app check (LOCALSPEC_STANDALONE=1)."""

from __future__ import annotations

import importlib.util
import json
import os
import plistlib
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from localspec.cli import main
from localspec.cli.service_cmd import ServiceSpec, render_launchd, render_systemd

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("ls_install", REPO / "packaging" / "install.py")
install = importlib.util.module_from_spec(_spec)
sys.modules["ls_install"] = install  # dataclasses resolve annotations through sys.modules
_spec.loader.exec_module(install)

BUILD = frozenset({"cmake", "cc", "c++", "gcc", "g++"})


def facts(**kw):
    base = {"system": "Linux", "machine": "x86_64", "tools": BUILD}
    return install.Facts(**{**base, **kw})


def test_nvidia_gpu_with_nvcc_builds_cuda_for_its_architecture_only():
    p = install.plan(facts(nvidia_gpus=("NVIDIA H200",), compute_caps=("9.0",), tools=BUILD | {"nvcc", "nvidia-smi"}))
    assert p.backend == "cuda"
    assert p.cmake_args == ["-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=90"]
    assert not p.missing
    assert any("H200" in r for r in p.reasons)


def test_two_gpus_give_both_architectures_and_unknown_capability_gives_none():
    two = install.plan(facts(nvidia_gpus=("A", "B"), compute_caps=("9.0", "8.6"), tools=BUILD | {"nvcc"}))
    assert "-DCMAKE_CUDA_ARCHITECTURES=86;90" in two.cmake_args
    unknown = install.plan(facts(nvidia_gpus=("A",), tools=BUILD | {"nvcc"}))
    assert unknown.cmake_args == ["-DGGML_CUDA=on"]
    assert any("unknown" in r for r in unknown.reasons)


def test_gpu_without_nvcc_is_a_missing_toolchain_not_a_silent_cpu_build():
    p = install.plan(facts(nvidia_gpus=("NVIDIA RTX 4090",), compute_caps=("8.9",), tools=BUILD | {"nvidia-smi"}))
    assert p.backend == "cuda"
    assert any(m.startswith("nvcc") for m in p.missing)


def test_apple_silicon_gets_metal_and_intel_mac_the_cpu():
    assert install.plan(facts(system="Darwin", machine="arm64")).backend == "metal"
    intel = install.plan(facts(system="Darwin", machine="x86_64"))
    assert intel.backend == "cpu" and "-DGGML_METAL=off" in intel.cmake_args


def test_no_gpu_builds_native_cpu_even_with_nvcc_installed():
    p = install.plan(facts(tools=BUILD | {"nvcc"}))
    assert p.backend == "cpu" and p.cmake_args == ["-DGGML_NATIVE=on"]
    assert any("--backend cuda" in r for r in p.reasons)


def test_missing_cmake_and_compiler_are_reported_with_their_fix():
    p = install.plan(facts(tools=frozenset()))
    assert any(m.startswith("cmake") for m in p.missing)
    assert any("compiler" in m for m in p.missing)


def test_vulkan_and_rocm_on_request():
    v = install.plan(facts(), "vulkan")
    assert v.cmake_args == ["-DGGML_VULKAN=on"] and any("glslc" in m for m in v.missing)
    r = install.plan(facts(tools=BUILD | {"hipcc"}, rocm_gpu_targets=("gfx1100",)), "rocm")
    assert r.cmake_args == ["-DGGML_HIP=on", "-DAMDGPU_TARGETS=gfx1100"] and not r.missing


def test_dry_run_prints_the_decision_and_a_cache_proof_pip_command():
    out = subprocess.run([sys.executable, str(REPO / "packaging" / "install.py"), "--dry-run", "--backend", "cpu"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode in (0, 2), out.stderr  # 2: this machine lacks a compiler or cmake
    assert "backend: cpu" in out.stdout
    assert "CMAKE_ARGS=-DGGML_NATIVE=on" in out.stdout
    assert "--no-cache-dir --force-reinstall" in out.stdout and "llama-cpp-python==0.3.36" in out.stdout
    if out.returncode == 0:
        assert "dry run: nothing installed" in out.stdout


# ---------------------------------------------------------------- service units


def _spec_for(tmp_path: Path) -> ServiceSpec:
    # host, port and profile as if given to `service install`, which bakes them into the unit
    return ServiceSpec(executable=["/opt/ls env/bin/localspec"], host="127.0.0.1", port=8123, profile="default",
                       env_file=tmp_path / "service.env", log_dir=tmp_path / "logs")


def test_systemd_unit_runs_serve_and_reads_secrets_from_an_env_file(tmp_path):
    text = render_systemd(_spec_for(tmp_path))
    lines = text.splitlines()
    assert 'ExecStart="/opt/ls env/bin/localspec" serve --host 127.0.0.1 --port 8123 --profile default' in lines
    assert f"EnvironmentFile=-{tmp_path / 'service.env'}" in lines
    assert "Restart=on-failure" in lines and "WantedBy=default.target" in lines


def test_launchd_plist_is_valid_and_sources_the_env_file(tmp_path):
    plist = plistlib.loads(render_launchd(_spec_for(tmp_path)).encode())
    args = plist["ProgramArguments"]
    assert args[:2] == ["/bin/sh", "-c"] and args[3] == str(tmp_path / "service.env")
    assert args[4:] == ["/opt/ls env/bin/localspec", "serve", "--host", "127.0.0.1", "--port", "8123",
                        "--profile", "default"]
    assert plist["RunAtLoad"] is True and plist["KeepAlive"] == {"SuccessfulExit": False}


@pytest.mark.parametrize("manager", ["systemd", "launchd"])
def test_install_and_uninstall_write_files_without_the_api_key(tmp_path, monkeypatch, capsys, manager):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("LOCALSPEC_API_KEY", "sk-secret-do-not-write")
    assert main(["service", "install", "--manager", manager, "--port", "8124", "--no-start"]) == 0
    unit = (tmp_path / ".config/systemd/user/localspec.service" if manager == "systemd"
            else tmp_path / "Library/LaunchAgents/dev.localspec.serve.plist")
    text = unit.read_text()
    assert "sk-secret-do-not-write" not in text and "8124" in text
    exe = Path(sys.executable).parent / "localspec"
    assert str(exe) in text and exe.is_absolute()
    env_file = Path(os.environ["LOCALSPEC_HOME"]) / "config" / "service.env"
    assert env_file.is_file() and stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert main(["service", "uninstall", "--manager", manager, "--no-stop"]) == 0
    assert not unit.exists() and env_file.exists()


def test_dry_run_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    assert main(["service", "install", "--manager", "systemd", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "ExecStart=" in out and "$ systemctl --user enable --now localspec.service" in out
    assert not (tmp_path / ".config").exists()


# ---------------------------------------------------------------- GPU cost check (CPU rehearsal parts)

GPU_CHECK = REPO / "packaging" / "gpu-check.sh"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "packaging" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


synth_gguf = _load("synth_gguf")
gpu_check = _load("gpu_check")
gpu_collect = _load("gpu_collect")
gpu_report = _load("gpu_report")


def _dry_run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(GPU_CHECK), "--dry-run", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


def test_gpu_check_dry_run_on_a_cpu_machine_plans_a_cpu_build(tmp_path):
    out = _dry_run("--small", str(tmp_path / "out"), env={"PATH": "/usr/bin:/bin"})  # no nvidia-smi there
    assert out.returncode == 0, out.stderr
    assert "backend: cpu (no NVIDIA GPU found" in out.stdout
    assert "-DGGML_CUDA" not in out.stdout and "-DBUILD_SHARED_LIBS=ON" in out.stdout
    assert "--target llama" in out.stdout and "--small" in out.stdout and "--out " + str(tmp_path / "out") in out.stdout
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


def test_gpu_check_dry_run_with_an_h200_builds_cuda_for_sm90_only(tmp_path):
    # A stand-in nvidia-smi answering like an H200 (compute capability 9.0) and a stand-in nvcc.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 9.0\n")
    (bin_dir / "nvcc").write_text("#!/bin/sh\necho nvcc\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    out = _dry_run("--no-fa", "--jobs", "16", str(tmp_path / "out"), env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert "backend: cuda (nvidia-smi reports compute capability 90)" in out.stdout
    assert "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real" in out.stdout  # SASS only: no PTX beside it
    assert f"-DCMAKE_CUDA_COMPILER={bin_dir / 'nvcc'}" in out.stdout and "-DGGML_CUDA_FA=OFF" in out.stdout
    assert "-DGGML_CUDA_FA_QUANTS=f16-f16" in out.stdout  # the engine's f16 KV cache: one vector-kernel set
    assert "-j 16" in out.stdout and "--small" not in out.stdout
    cpu = _dry_run("--cpu", str(tmp_path / "out"), env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert "backend: cpu (--cpu given)" in cpu.stdout and "-DGGML_CUDA" not in cpu.stdout


def test_gpu_check_takes_cublas_from_the_pip_wheel_when_the_toolkit_has_none(tmp_path):
    # A toolkit assembled from pip wheels (nvcc + cudart, as on the borrowed box) has no cublas_v2.h:
    # CMake's FindCUDAToolkit then finds no CUDA::cublas and the configure fails. PyTorch's
    # nvidia-cublas wheel has it, under versioned names only, so the check names it to CMake.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvcc").write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    (bin_dir / "nvcc").chmod(0o755)
    wheel = tmp_path / "site" / "nvidia" / "cu13"
    (wheel / "include").mkdir(parents=True)
    (wheel / "lib").mkdir()
    for f in ("include/cublas_v2.h", "lib/libcublas.so.13", "lib/libcublasLt.so.13"):
        (wheel / f).write_text("")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHON": sys.executable, "CUDA_HOME": str(tmp_path / "none"),
           "CUDA_DEFAULT": str(tmp_path / "none")}
    found = _dry_run("--arch", "90", str(tmp_path / "out"), env={**env, "PYTHONPATH": str(tmp_path / "site")})
    assert found.returncode == 0, found.stderr
    assert "backend: cuda (--arch 90 given)" in found.stdout
    assert f"cuBLAS: the pip wheel at {wheel}" in found.stdout
    assert (f"-DCMAKE_CUDA_FLAGS=-I{wheel}/include -DCUDA_cublas_LIBRARY={wheel}/lib/libcublas.so.13 "
            f"-DCUDA_cublasLt_LIBRARY={wheel}/lib/libcublasLt.so.13") in found.stdout
    missing = _dry_run("--arch", "90", str(tmp_path / "out"), env={**env, "PYTHONPATH": str(tmp_path / "empty")})
    assert "cuBLAS: not found" in missing.stdout and "-DCUDA_cublas_LIBRARY" not in missing.stdout
    assert _dry_run("--arch", "9.0", str(tmp_path / "out"), env=env).returncode == 2  # no dot


def test_the_device_command_unpacks_the_bundle_once_and_runs_the_check_into_out(tmp_path):
    # A stand-in bundle whose gpu-check.sh reports what it was given.
    stage = tmp_path / "stage"
    stage.mkdir()
    (stage / "gpu-check.sh").write_text('echo "check $* budget=$BUDGET_S build=$BUILD_LIMIT_S work=$WORK"\n')
    bundle = tmp_path / "repo" / ".gpu" / "localspec-gpu-check.tar.gz"
    bundle.parent.mkdir(parents=True)
    subprocess.run(["tar", "czf", str(bundle), "-C", str(stage), "."], check=True)
    env = {**os.environ, "UNPACK": str(tmp_path / "unpacked"), "OUT": str(tmp_path / "out"), "WORK": "/w"}
    env.pop("BUDGET_S", None)
    run = lambda *a: subprocess.run(["bash", str(REPO / "packaging" / "gpu-device-run.sh"), *a],  # noqa: E731
                                    cwd=tmp_path / "repo", env=env, capture_output=True, text=True, timeout=60)
    first = run("--arch", "90", "--small")
    assert first.returncode == 0, first.stderr
    assert "unpacked .gpu/localspec-gpu-check.tar.gz" in first.stdout
    assert f"check --arch 90 --small {tmp_path / 'out'} budget=330 build=240 work=/w" in first.stdout
    second = run()
    assert "reusing" in second.stdout and "unpacked .gpu" not in second.stdout  # a rerun keeps the build's sources
    bundle.unlink()
    missing = run()
    assert missing.returncode == 2 and "fix: run packaging/gpu-bundle.sh .gpu" in missing.stderr


def _prebuilt_bundle(tmp_path: Path, *, offloads: bool) -> tuple[Path, dict]:
    """An unpacked --prebuilt bundle in miniature: gpu-check.sh, prebuilt/ for sm_90, a llama_cpp that
    says whether it offloads, a gpu_check.py that reports how it was run; a box whose nvidia-smi
    says 9.0, with no nvcc, and PyTorch's cuBLAS wheel on the path."""
    bundle = tmp_path / "bundle"
    (bundle / "prebuilt").mkdir(parents=True)
    (bundle / "gpu-check.sh").write_text(GPU_CHECK.read_text())
    (bundle / "prebuilt" / "BUILD_INFO").write_text("llama-cpp-python 0.3.36 for sm_90\narch=90\ncuda_major=13\n")
    (bundle / "prebuilt" / "libllama.so").write_text("")
    pkg = bundle / "llama-cpp-python" / "llama_cpp"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"def llama_supports_gpu_offload():\n    return {offloads}\n")
    check = bundle / "localspec-src" / "packaging" / "gpu_check.py"
    check.parent.mkdir(parents=True)
    check.write_text("import os, sys; print('measuring', ' '.join(sys.argv[1:3]), os.environ['LD_LIBRARY_PATH'])\n")
    (bundle / "ggml-vocab-qwen2.gguf").write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 9.0\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    wheel = tmp_path / "site" / "nvidia" / "cu13"
    for f in ("include/cublas_v2.h", "lib/libcublas.so.13", "lib/libcublasLt.so.13"):
        (wheel / f).parent.mkdir(parents=True, exist_ok=True)
        (wheel / f).write_text("")
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHON": sys.executable, "PYTHONPATH": str(tmp_path / "site"),
           "WORK": str(tmp_path / "work"), "CUDA_HOME": str(tmp_path / "none"), "CUDA_DEFAULT": str(tmp_path / "none")}
    return bundle, env


def test_prebuilt_libraries_are_used_when_they_offload_with_no_nvcc_and_no_source(tmp_path):
    bundle, env = _prebuilt_bundle(tmp_path, offloads=True)
    out = subprocess.run(["bash", str(bundle / "gpu-check.sh"), str(tmp_path / "out")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "prebuilt: llama-cpp-python 0.3.36 for sm_90" in out.stdout
    assert "the prebuilt libraries load and offload to the GPU" in out.stdout and "== build" not in out.stdout
    assert "Cuda compilation tools" not in (tmp_path / "out" / "environment.txt").read_text()  # no nvcc was there
    assert (bundle / "llama-cpp-python" / "llama_cpp" / "lib" / "libllama.so").exists()
    # The libraries' own directory first (their RUNPATHs name the build dir they were linked in), then cuBLAS's.
    lib_dirs = f"{bundle / 'llama-cpp-python' / 'llama_cpp' / 'lib'}:{tmp_path / 'site' / 'nvidia' / 'cu13' / 'lib'}"
    assert f"measuring --out {tmp_path / 'out'} {lib_dirs}" in out.stdout


def test_prebuilt_libraries_that_do_not_offload_stop_the_check_with_the_fix_when_nothing_can_build(tmp_path):
    bundle, env = _prebuilt_bundle(tmp_path, offloads=False)
    out = subprocess.run(["bash", str(bundle / "gpu-check.sh"), str(tmp_path / "out")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1  # (the run's stderr goes to check.log and stdout, with the rest)
    assert "the prebuilt libraries failed here (they load but see no GPU)" in out.stdout
    assert "fix: carry a source bundle" in out.stdout and "measuring" not in out.stdout
    assert "FAILED: the prebuilt libraries failed here" in (tmp_path / "out" / "summary.txt").read_text()


def test_a_cut_run_is_collected_with_the_steps_it_got_to(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    # Cut after the short-context sweep: the long one was still empty when calibration.json was written.
    (out / "calibration.json").write_text(json.dumps({"sweep": {"verify_by_rows": [0.01]},
                                                      "sweep_long_context": {"verify_by_rows": []}}))
    (out / "environment.txt").write_text("NVIDIA H200, 143771 MiB, 9.0, 580.159.03\n")
    dest = tmp_path / "docs" / "gpu" / "h200-2026-12-07.json"
    assert gpu_collect.main([str(out), str(dest)]) == 0
    got = json.loads(dest.read_text())
    assert got["steps_present"] == ["sweep"]  # the long sweep's placeholder, still empty, is not a step done
    assert got["environment"] == ["NVIDIA H200, 143771 MiB, 9.0, 580.159.03"] and "engine" not in got
    empty = tmp_path / "empty"
    empty.mkdir()
    assert gpu_collect.main([str(empty), str(tmp_path / "x.json")]) == 1 and not (tmp_path / "x.json").exists()
    assert gpu_collect.main([str(tmp_path / "nowhere"), str(tmp_path / "x.json")]) == 2
    assert "fix: give the folder" in capsys.readouterr().err


def test_the_collected_run_names_its_gpu_and_a_file_named_for_another_is_refused(tmp_path, capsys):
    # The device tool's first call gets an H100 unless it names nvidia-h200: an H100's run must not
    # land as docs/gpu/h200-*.json, the file issue #30 asks for.
    out = tmp_path / "out"
    out.mkdir()
    (out / "calibration.json").write_text(json.dumps({"sweep": {"verify_by_rows": [0.01]}}))
    (out / "environment.txt").write_text("Mon Dec  7 09:00:00 UTC 2026\nname, memory.total [MiB], compute_cap, "
                                         "driver_version\nNVIDIA H100 80GB HBM3, 81559 MiB, 9.0, 580.159.04\n")
    h200 = tmp_path / "docs" / "gpu" / "h200-2026-12-07.json"
    assert gpu_collect.main([str(out), str(h200)]) == 1 and not h200.exists()
    err = capsys.readouterr().err
    assert "is named for H200 but the run came from NVIDIA H100 80GB HBM3" in err and "fix: name the file" in err
    for misnamed in ("h200.json", "H200-2026-12-07.json", "2026-12-07-h200.json", "h20-2026-12-07.json",
                     "a10-2026.json"):
        assert gpu_collect.main([str(out), str(tmp_path / misnamed)]) == 1, misnamed
    capsys.readouterr()
    h100 = tmp_path / "docs" / "gpu" / "h100-2026-12-07.json"
    assert gpu_collect.main([str(out), str(h100)]) == 0
    assert json.loads(h100.read_text())["gpu"] == {"name": "NVIDIA H100 80GB HBM3", "memory": "81559 MiB",
                                                    "compute_cap": "9.0", "driver": "580.159.04"}
    # A CPU rehearsal (no nvidia-smi line) cannot pass for a GPU's run either.
    (out / "environment.txt").write_text("Linux box 6.1 x86_64\nPython 3.12.1\n")
    assert gpu_collect.main([str(out), str(h200)]) == 1 and "shows no GPU" in capsys.readouterr().err
    assert gpu_collect.main([str(out), str(tmp_path / "rehearsal.json")]) == 0


def test_the_collected_run_says_how_its_libraries_came_prebuilt_or_built_there(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "calibration.json").write_text(json.dumps({"sweep": {"verify_by_rows": [0.01]}}))
    (out / "build.log").write_text("the prebuilt libraries failed here: they load but see no GPU\n[1/229] nvcc ...\n"
                                   "ninja_log: 2709\tTOTAL (229 steps)\nninja_log: 48.1\tggml/src/ggml-cuda/mmq.cu.o\n")
    assert gpu_collect.collect(out)["libraries"] == ("the prebuilt libraries failed here: they load but see no GPU; "
                                                     "built there: 2709 compile-seconds over 229 steps")
    (out / "build.log").write_text("the prebuilt libraries load and offload to the GPU\n")
    assert gpu_collect.collect(out)["libraries"] == "the prebuilt libraries load and offload to the GPU"
    (out / "build.log").unlink()
    assert gpu_collect.collect(out)["libraries"] is None


# A CPU rehearsal of the device command (packaging/README.md, at 0616147), collected by gpu_collect.py.
GPU_REHEARSAL = REPO / "tests" / "data" / "gpu-rehearsal-2026-12-07.json"


def _as_if_on_a_gpu(tmp_path: Path) -> Path:
    """The rehearsal relabelled as an H200's run (nvidia-smi's row, offload on), to drive the GPU path."""
    run = json.loads(GPU_REHEARSAL.read_text())
    run["gpu"] = {"name": "NVIDIA H200", "memory": "143771 MiB", "compute_cap": "9.0", "driver": "580.159.03"}
    run["calibration"]["machine"]["gpu_offload"] = True
    run["libraries"] = "the prebuilt libraries load and offload to the GPU"
    run["environment"] += ["Cuda compilation tools, release 13.0, V13.0.88", "NVIDIA H200, 143771 MiB, 9.0, 580.159.03"]
    plans = {role: {"n_gpu_layers": -1, "offloaded": n, "n_layers": n, "gpu_bytes": size, "total_bytes": size,
                    "message": f"offloading all {n} layers ({size / 2**30:.1f} GiB): free VRAM 139.5 GiB"}
             for role, n, size in (("target", 4, 700 * 2**20), ("draft", 2, 500 * 2**20))}
    run["calibration"]["offload"] = {"probe": "nvidia-smi", "free_before": 149_789_933_568, "plans": plans,
                                     "planned_bytes": 1200 * 2**20, "probe_after": "nvidia-smi",
                                     "used": {"load": 1400 * 2**20, "sweeps": 1500 * 2**20}, "planned_over_used": 0.8}
    path = tmp_path / "docs" / "gpu" / "h200-2026-12-09.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(run))
    return path


def test_a_cpu_rehearsal_is_reported_as_one_and_never_quoted_in_the_readme(tmp_path, capsys):
    run = tmp_path / GPU_REHEARSAL.name
    run.write_text(GPU_REHEARSAL.read_text())
    readme = tmp_path / "README.md"
    readme.write_text("## Performance\n<!-- bench-summary:start -->\nx\n<!-- bench-summary:end -->\n")
    assert gpu_report.main([str(run), "--readme", str(readme)]) == 1
    assert "is not a GPU measurement (no GPU seen)" in capsys.readouterr().err
    assert "gpu-summary" not in readme.read_text()
    assert gpu_report.main([str(run), "--out", str(tmp_path / "report.md")]) == 0
    report = (tmp_path / "report.md").read_text()
    assert "**Not a GPU measurement**: no GPU was seen" in report and "## Measured on the GPU" not in report
    assert "on no GPU (a CPU rehearsal)" in report and "2026-12-07" in report
    assert "Not measured: a run from before the check planned the split." in report  # the fixture predates it


def test_a_gpu_run_gives_a_report_that_keeps_measured_and_predicted_apart_and_the_readme_lines(tmp_path):
    run = _as_if_on_a_gpu(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text((REPO / "README.md").read_text())
    assert gpu_report.main([str(run), "--readme", str(readme)]) == 0
    report = (run.parent / "README.md").read_text()
    measured, predicted = report.split("## Predicted, not measured")
    assert "## Measured on the GPU" in measured and "NVIDIA H200 (driver 580.159.03; nvcc there: 13.0, V13.0.88)" in measured
    assert "; the prebuilt libraries load and offload to the GPU." in measured
    assert ("The product's GPU split (free VRAM by nvidia-smi): target: offloading all 4 layers (0.7 GiB): free VRAM "
            "139.5 GiB; draft: offloading all 2 layers (0.5 GiB): free VRAM 139.5 GiB; planned 1.17 GiB; used 1.37 GiB "
            "after the load, 1.46 GiB after the sweeps (planned / most used 0.800: short by more than the 5% kept spare, "
            "so a GPU the planner says just fits runs out of memory).") in measured
    assert "| 9 | 10.1 | 2.77 | 15.0 | 3.41 | 5.9 |" in measured  # verify ms, ratio, at 2k context, draft
    assert "| `prediction` | 833.4 | 3.50 | 119/119 | yes |" in measured  # the engine at 100% acceptance
    assert "| 16 | 0 | 0 | - | 0.0056 |" in measured and "Not a GPU measurement" not in report
    assert "| editing | lookup | lookup k=8: 1.41x | - |" in predicted and "| predicted | 3.40x | 84% |" in predicted
    text = readme.read_text()
    block = text.split(gpu_report.README_START)[1].split(gpu_report.README_END)[0]
    assert text.index(gpu_report.README_START) > text.index(gpu_report.README_AFTER)  # after the bench summary
    assert "On one NVIDIA H200, 2026-12-07," in block and "- measured: a verify of 9 rows costs 2.77 single steps" in block
    assert "`prediction` 3.50x" in block and "every mode gave `off`'s answer" in block
    assert "- predicted from the CPU bench's acceptance on these costs, `auto`'s best speed-up per suite (lag 0): all 1.17x" in block
    # A later run replaces the lines rather than adding a second block.
    assert gpu_report.main([str(run), "--readme", str(readme)]) == 0
    assert readme.read_text() == text and text.count(gpu_report.README_START) == 1


def test_a_gpu_run_that_crashed_in_its_first_sweep_keeps_its_split_but_is_not_quoted(tmp_path, capsys):
    run = json.loads(_as_if_on_a_gpu(tmp_path).read_text())
    out = tmp_path / "out"
    out.mkdir()
    # What calibration.json holds before the first pass: the machine, the models and the split.
    early = {k: run["calibration"][k] for k in ("machine", "models", "word_chain", "load_seconds", "offload")}
    (out / "calibration.json").write_text(json.dumps(early))
    (out / "environment.txt").write_text("\n".join(run["environment"]) + "\n")
    dest = tmp_path / "docs" / "gpu" / "h200-2026-12-10.json"
    assert gpu_collect.main([str(out), str(dest)]) == 0
    assert json.loads(dest.read_text())["steps_present"] == ["offload_plan"]
    readme = tmp_path / "README.md"
    readme.write_text((REPO / "README.md").read_text())
    assert gpu_report.main([str(dest), "--readme", str(readme)]) == 1
    assert "stopped before its first sweep: no cost to quote; fix:" in capsys.readouterr().err
    assert readme.read_text() == (REPO / "README.md").read_text()
    assert gpu_report.main([str(dest)]) == 0
    report = (dest.parent / "README.md").read_text()
    assert "Steps reached: offload_plan; not reached: sweep," in report and "No cost was measured" in report
    assert "The product's GPU split (free VRAM by nvidia-smi): target: offloading all 4 layers" in report


def test_a_cut_run_and_bad_input_are_reported_not_crashed_on(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    full = json.loads(GPU_REHEARSAL.read_text())
    (out / "calibration.json").write_text(json.dumps({**full["calibration"], "engine_calibration": {},
                                                      "sweep_long_context": {"context": 2048, "verify_by_rows": []}}))
    dest = tmp_path / "cut-2026-12-07.json"
    assert gpu_collect.main([str(out), str(dest)]) == 0
    assert gpu_report.main([str(dest)]) == 0
    report = (tmp_path / "README.md").read_text()
    assert "Steps reached: sweep; not reached: offload_plan, sweep_long_context, engine_calibration, predictions" in report
    assert "| 9 | 10.1 | 2.77 | - | - | 5.9 |" in report and "Nothing predicted: the run stopped before" in report
    assert "Not measured: the run stopped before it." in report
    (tmp_path / "junk.json").write_text("{not json")
    assert gpu_report.main([str(tmp_path / "junk.json")]) == 2
    assert "fix: give the JSON gpu_collect.py wrote" in capsys.readouterr().err
    (tmp_path / "other.json").write_text("[1, 2]")
    assert gpu_report.main([str(tmp_path / "other.json")]) == 2
    assert "fix: run packaging/gpu_collect.py first" in capsys.readouterr().err


def test_what_failed_in_a_run_is_reported_and_a_malformed_run_is_refused_in_one_line(tmp_path, capsys):
    run = json.loads(_as_if_on_a_gpu(tmp_path).read_text())
    runs = run["engine"]["runs"]
    runs["off"] = {"finish": "error", "error": "RuntimeError: out of memory"}  # off failed: nothing to compare with
    for mode in ("prediction", "lookup", "draft", "auto"):
        runs[mode].pop("first_difference")
    runs["draft"]["tokens_per_s"] = None
    run["engine"]["second_target"]["error"] = "RuntimeError: load failed"  # after its sweep
    run["engine"]["batch_flips"] = {"skipped": "no time left"}
    run["predictions"]["predicted_outputs"]["sweep"][0].update(covered=None, ceiling=None)
    del run["predictions"]["bench"]
    run["unreadable"] = {"engine.json": "Expecting value: line 1 column 1 (char 0)"}
    path = tmp_path / "h200-failed.json"
    path.write_text(json.dumps(run))
    assert gpu_report.main([str(path), "--out", str(tmp_path / "r.md")]) == 0
    report = (tmp_path / "r.md").read_text()
    assert "| `off` | - | - | - | failed: RuntimeError: out of memory |" in report
    assert "| `lookup` | 440.3 | - | 69/69 | - |" in report and "| `draft` | - | - | 85/241 | - |" in report
    assert "Then it failed: RuntimeError: load failed." in report
    assert "Not measured: skipped: no time left." in report and "| editing | 1.46x | - | - |" in report
    assert "No bench JSON was given: no acceptance profile." in report
    assert "Unreadable (cut off mid-write): engine.json: Expecting value" in report
    run["engine"] = {"error": "RuntimeError: no CUDA device"}  # the engine never started
    run["calibration"]["word_chain"] = None  # a --flat run
    path.write_text(json.dumps(run))
    assert gpu_report.main([str(path), "--out", str(tmp_path / "r.md")]) == 0
    report = (tmp_path / "r.md").read_text()
    assert "Not measured: failed: RuntimeError: no CUDA device." in report and "all random (`--flat`" in report
    # Null parts read as missing; a part of the wrong shape is one line naming the file and the fix.
    path.write_text(json.dumps({**run, "engine": None, "predictions": None}))
    assert gpu_report.main([str(path), "--out", str(tmp_path / "r.md")]) == 0
    assert "Nothing predicted: the run stopped before the predictions." in (tmp_path / "r.md").read_text()
    path.write_text(json.dumps({**run, "predictions": {"costs": {"sweep": [{"suite": "code"}]}}}))
    assert gpu_report.main([str(path), "--out", str(tmp_path / "r.md")]) == 2
    err = capsys.readouterr().err
    assert "is malformed (KeyError: 'mode'); fix: collect it again with packaging/gpu_collect.py" in err


@pytest.mark.parametrize("markers", [
    "<!-- gpu-summary:end -->\nkeep\n<!-- gpu-summary:start -->\n",  # out of order
    "<!-- gpu-summary:start -->\nkeep\n",  # a start without its end: replacing would eat to the next end
    "<!-- gpu-summary:start -->\na\n<!-- gpu-summary:end -->\n<!-- gpu-summary:start -->\nb\n<!-- gpu-summary:end -->\n",
])
def test_readme_markers_that_are_not_one_ordered_pair_are_refused_and_the_readme_is_kept(tmp_path, capsys, markers):
    run = _as_if_on_a_gpu(tmp_path)
    readme = tmp_path / "README.md"
    text = f"## Performance\n<!-- bench-summary:start -->\nx\n<!-- bench-summary:end -->\n{markers}## Documentation\n"
    readme.write_text(text)
    assert gpu_report.main([str(run), "--readme", str(readme)]) == 1
    assert readme.read_text() == text
    assert "(one of each, in that order, or neither); fix: leave one" in capsys.readouterr().err


def test_gpu_check_rejects_bad_arguments(tmp_path):
    assert _dry_run().returncode == 2  # no output directory
    bad = _dry_run("--frobnicate", str(tmp_path))
    assert bad.returncode == 2 and "unknown option --frobnicate" in bad.stderr
    assert _dry_run("--jobs", "many", str(tmp_path)).returncode == 2
    assert "backend:" in _dry_run(env={"OUT": str(tmp_path / "o"), "PATH": "/usr/bin:/bin"}).stdout  # $OUT works


def test_bundle_script_without_a_python_says_so_in_one_line_before_downloading(tmp_path):
    missing = tmp_path / "no-venv" / "python"
    r = subprocess.run(["bash", str(REPO / "packaging" / "gpu-bundle.sh"), str(tmp_path / "out")],
                       env={**os.environ, "PYTHON": str(missing)}, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == (f"error: no Python at {missing}; fix: make the README's venv in {REPO}, or set PYTHON to one "
                        "with localspec's deps\n")


def test_bundle_script_keeps_what_the_check_needs():
    text = (REPO / "packaging" / "gpu-bundle.sh").read_text()
    assert "LIMIT=$((60 * 1024 * 1024))" in text and "MANIFEST.txt" in text
    for needed in ("ggml-vocab-qwen2.gguf", "gguf-py/gguf", "localspec packaging", "gpu-check.sh",
                   "docs/bench/quick.json", "pydantic-core==", "diskcache=="):
        assert needed in text, needed
    removed = text[text.index("for b in "):].split(";")[0]
    assert "cuda" not in removed  # the CUDA backend's sources stay in


def test_random_qwen_shapes_and_quant_mix():
    s7 = synth_gguf.SHAPES["qwen2.5-coder-7b"]
    assert round(s7.n_params() / 1e9, 2) == 7.62 and s7.head_dim == 128
    plan = {name: (shape, kind) for name, shape, kind in synth_gguf.tensor_plan(s7)}
    Q = synth_gguf.Q
    assert plan["token_embd.weight"] == ((152064, 3584), Q.Q4_K)
    assert plan["output.weight"][1] == Q.Q6_K
    assert plan["blk.0.attn_k.weight"] == ((512, 3584), Q.Q4_K)
    assert plan["blk.0.ffn_down.weight"] == ((3584, 18944), Q.Q6_K)  # a "more bits" layer
    assert plan["blk.4.ffn_down.weight"][1] == Q.Q4_K
    half = {name: kind for name, _, kind in synth_gguf.tensor_plan(synth_gguf.SHAPES["qwen2.5-coder-0.5b"])}
    assert half["blk.5.attn_q.weight"] == Q.Q5_0 and half["output.weight"] == Q.Q8_0  # 896 is not a multiple of 256
    q8 = {kind for _, _, kind in synth_gguf.tensor_plan(s7, "q8_0")}
    assert q8 == {Q.Q8_0, Q.F32}


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q5_0", "Q8_0"])
def test_random_blocks_dequantize_to_small_finite_weights(kind):
    import gguf
    import numpy as np

    q = gguf.GGMLQuantizationType[kind]
    raw = synth_gguf.random_blocks(q, (8, 512), np.random.default_rng(0))
    w = gguf.quants.dequantize(raw, q)
    assert w.shape == (8, 512) and np.isfinite(w).all()
    assert 0.005 < float(w.std()) < 0.05 and abs(float(w.mean())) < 0.01
    # Every 32 weights average zero (as 32 independent draws do): no sub-block carries a constant
    # offset, which 28 identical layers would add up to one direction outweighing the embedding.
    sub_means = w.reshape(8, -1, 32).mean(axis=2)
    assert float(sub_means.std()) < 1.5 * float(w.std()) / 32**0.5
    # Nor do all of them share one: at most Q5_0's d*(q-16), whose random q average -0.5 d (5% of the spread).
    assert abs(float(w.mean())) < 0.07 * float(w.std())


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q5_0", "Q8_0"])
def test_sign_rows_encode_exactly_in_each_type(kind):
    # The word chain's rows are +-amplitude sign patterns written straight into ggml's block layouts:
    # gguf-py's own dequantizer must read back the same signs and (to fp16) amplitudes, zero rows too.
    import gguf
    import numpy as np

    q = gguf.GGMLQuantizationType[kind]
    signs = np.random.default_rng(0).random((4, 512)) < 0.5
    amplitude = np.array([8.0, 0.05, 0.0, 1.0], dtype=np.float32)
    w = gguf.quants.dequantize(synth_gguf.sign_blocks(q, signs, amplitude), q)
    np.testing.assert_allclose(w, np.where(signs, 1.0, -1.0) * amplitude[:, None], rtol=2e-3, atol=0)


def test_the_word_chain_is_a_permutation_of_plain_words_in_cycles_and_the_draft_follows_part_of_it():
    import numpy as np

    tokens = ["Ġthe", "!", "Ġa", "ing", *[f"Ġw{c}{d}" for c in "abcdefghij" for d in "klmnopqrst"], "ĠCap", "<|im_end|>"]
    ids = synth_gguf.word_ids(tokens)
    assert [tokens[i] for i in ids[:2]] == ["Ġthe", "Ġwak"] and len(ids) == 101  # " a", "ĠCap", specials: off
    succ = synth_gguf.successors(ids, len(tokens) + 5, cycle=10)
    on = np.flatnonzero(succ >= 0)
    assert list(on) == list(ids) and sorted(succ[on]) == sorted(ids)  # every word leads to one word, each once
    t, seen = int(ids[0]), []
    while t not in seen:
        seen.append(t)
        t = int(succ[t])
    assert len(seen) in (10, 11)  # a cycle of 10 (the last one takes the remainder, 101 = 9 x 10 + 11)
    draft = synth_gguf.disagree(succ, 0.3)
    assert sorted(draft[on]) == sorted(ids) and (draft < 0).sum() == (succ < 0).sum()
    assert int((draft[on] != succ[on]).sum()) == 30
    with pytest.raises(ValueError, match="cannot make cycles"):
        synth_gguf.successors(ids[:15], 200, cycle=10)


def test_conditional_rates_from_bench_counts():
    # 10 drafts reach position 1 and 8 survive; 8 reach position 2 and 6 survive (so 6/8 of the
    # survivors of position 1 survive position 2 given the survival ratio s2 = 0.75 over s1 = 0.8).
    rates = gpu_check.conditional_rates([10, 8, 0], [8, 6, 0])
    assert rates == pytest.approx([0.8, 0.75 / 0.8])
    bench = {"runs": [
        {"suite": "code", "mode": "draft-k4", "drafted_by_position": [10, 8], "accepted_by_position": [8, 6]},
        {"suite": "code", "mode": "off", "drafted_by_position": [], "accepted_by_position": []},
        {"suite": "chat", "mode": "lookup", "drafted_by_position": [4], "accepted_by_position": [1]},
    ]}
    profiles = {(p["suite"], p["mode"]): p for p in gpu_check.profiles_from_bench(bench)}
    assert set(profiles) == {("code", "draft-k4"), ("chat", "lookup"), ("all", "draft-k4"), ("all", "lookup")}
    assert profiles[("chat", "lookup")]["drafter"] == "lookup"


def test_prediction_follows_the_costs():
    from localspec.engine.controller import Costs

    good = {"suite": "code", "mode": "draft-k4", "drafter": "draft", "conditional_rates": [0.95] * 4}
    gpu_like = Costs(verify=[0.010 + 0.0002 * n for n in range(16)], draft_step=0.002, draft_row=0.0001)
    p = gpu_check.predict(gpu_like, good)
    assert p["lag0"]["drafter"] == "draft" and p["lag0"]["k"] >= 4 and p["lag0"]["speedup"] > 2
    cpu_like = Costs(verify=[0.05 * (1 + 0.6 * n) for n in range(16)], draft_step=0.03, draft_row=0.01)
    assert gpu_check.predict(cpu_like, good)["lag0"] == {"drafter": "off", "k": 0, "speedup": 1.0}


def test_predicted_outputs_are_estimated_from_the_cpu_runs_passes_on_the_measured_curve():
    from localspec.engine.controller import Costs

    # Two edits of 101 tokens (100 after the prefill's): one in 20 passes that each verified 4 drafted
    # tokens (5 rows), one in 10 passes of 5 rows and 40 plain ones.
    bench = {"runs": [
        {"suite": "predicted", "mode": "auto+prediction", "prompt": "a", "tokens": 101, "target_passes": 20,
         "drafted": 80, "accepted": 80, "drafted_by_position": [20, 20, 20, 20]},
        {"suite": "predicted", "mode": "auto+prediction", "prompt": "b", "tokens": 101, "target_passes": 50,
         "drafted": 40, "accepted": 40, "drafted_by_position": [10, 10, 10, 10]},
        {"suite": "predicted", "mode": "off", "prompt": "a", "tokens": 101, "target_passes": 100},
    ]}
    flat = Costs(verify=[0.010] * 17, draft_step=0.002, draft_row=0.0001)
    steep = Costs(verify=[0.010 * (1 + 0.6 * n) for n in range(17)], draft_step=0.002, draft_row=0.0001)
    [on_flat] = gpu_check.prediction_estimates(bench, flat)
    [on_steep] = gpu_check.prediction_estimates(bench, steep)
    # Re-costed: 100 plain passes' worth against 20 × verify(5), and against 10 × verify(5) + 40 × verify(1).
    assert on_flat["runs"] == 2 and on_flat["recosted_speedup"] == pytest.approx((100 / 20 + 100 / 50) / 2)
    assert on_steep["recosted_speedup"] == pytest.approx((100 / (20 * 3.4) + 100 / (10 * 3.4 + 40)) / 2, abs=1e-3)
    assert on_flat["covered"] == pytest.approx((80 / 101 + 40 / 101) / 2, abs=1e-3)
    assert on_flat["ceiling"]["speedup"] > on_steep["ceiling"]["speedup"]
    assert gpu_check.prediction_estimates({}, flat) == []


class FlipRuntime:
    """Five-token logits that lead by known gaps; passes of more rows read two rows the other way:
    position 257 (lead 0.1) in any multi-row pass, position 260 (lead 0.5) in passes of 5+ rows."""

    def __init__(self) -> None:
        self.removed: list[tuple[int, int, int]] = []

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        self.removed.append((seq, p0, p1))

    def decode(self, rows):
        import numpy as np

        out = []
        for r in rows:
            lead = {257: 0.1, 260: 0.5}.get(r.pos, 1.0)
            logits = np.array([2.0, 2.0 - lead, 0.0, 0.0, 0.0])
            if (r.pos == 257 and len(rows) > 1) or (r.pos == 260 and len(rows) >= 5):
                logits[1] = 2.0 + 0.01
            if r.logits:
                out.append(logits)
        return np.array(out)


def test_batch_flips_counts_argmax_changes_by_pass_size_with_their_gaps():
    rt = FlipRuntime()
    result = gpu_check.batch_flips(rt, list(range(300)), context=256, rows=8, sizes=(2, 5))
    assert result["context"] == 256 and result["rows"] == 8
    two, five = result["by_rows"]["2"], result["by_rows"]["5"]
    assert two == {"flips": 1, "within_margin": 1, "gaps": [0.1], "max_abs_logit_diff": pytest.approx(0.11)}
    assert five["flips"] == 2 and five["within_margin"] == 1 and five["gaps"] == [0.1, 0.5]
    assert result["one_row_lead_under"] == {"0.01": 0, "0.05": 0, "0.1": 0, "0.25": 1, "0.5": 1}
    assert rt.removed[-1] == (0, 0, -1)  # leaves the sequence empty for whatever runs next


@pytest.fixture(scope="module")
def word_chain(draft_path):
    return gpu_check.word_chain(draft_path)


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory, draft_path, word_chain):
    """The --small rehearsal models with the word chain, tokenizer taken from the real draft model's file."""
    d = tmp_path_factory.mktemp("synth")
    out = {}
    for name, role in (("small-target", "target"), ("small-draft", "draft")):
        out[name] = synth_gguf.write_random_gguf(d / f"{name}.gguf", synth_gguf.SHAPES[name], draft_path,
                                                 successor=word_chain[role])
    return out


def test_synthetic_models_load_in_llama_cpp_and_calibrate(tiny_models, draft_path, word_chain):
    from localspec.engine import calibrate
    from localspec.engine.runtime import ModelRuntime, Row, RuntimeConfig
    from tests.common import TEST_THREADS

    assert tiny_models["small-draft"]["types"]["Q5_0"] > 0  # the 192-wide rows used the fallback
    cfg = RuntimeConfig(n_ctx=256, n_threads=TEST_THREADS)
    target = ModelRuntime(tiny_models["small-target"]["path"], cfg)
    draft = ModelRuntime(tiny_models["small-draft"]["path"], cfg)
    try:
        assert target.n_vocab == 151936 and target.meta("qwen2.block_count") == "4"
        ids = target.tokenize("def add(a, b):")
        assert target.detokenize(ids) == "def add(a, b):"  # the real Qwen tokenizer came along
        import numpy as np

        logits = target.decode([Row(t, i, 0, logits=True) for i, t in enumerate(ids)])
        assert logits.shape == (len(ids), 151936) and np.isfinite(logits).all()
        target.seq_rm(0, 0, -1)
        # After a word, llama.cpp's greedy pick is its successor on the chain, far ahead of the rest.
        succ = word_chain["target"]
        words = target.tokenize(" hello world example")
        assert all(succ[t] >= 0 for t in words)
        logits = target.decode([Row(t, i, 0, logits=True) for i, t in enumerate(words)])
        assert [int(row.argmax()) for row in logits] == [int(succ[t]) for t in words]
        top_two = np.sort(logits, axis=1)[:, -2:]
        assert (top_two[:, 1] - top_two[:, 0]).min() > 5  # a margin no batch size's rounding can cross
        target.seq_rm(0, 0, -1)
        costs = calibrate.measure(target, draft, k_max=3, rounds=2)
        assert len(costs.verify) == 4 and all(c > 0 for c in costs.verify) and costs.draft_step > 0
    finally:
        target.close()
        draft.close()


def test_the_products_gpu_split_is_planned_on_free_vram_and_held_against_what_the_load_took(tiny_models):
    from localspec.engine.runtime import RuntimeConfig

    paths = {"target": tiny_models["small-target"]["path"], "draft": tiny_models["small-draft"]["path"]}
    cfg = RuntimeConfig(n_ctx=gpu_check.SWEEP_N_CTX)
    GiB = 2**30
    plan = gpu_check.offload_plan(paths, cfg, offload_supported=True, probe=lambda: (139 * GiB, "nvidia-smi"))
    assert plan["probe"] == "nvidia-smi" and plan["free_before"] == 139 * GiB
    assert [p["n_gpu_layers"] for p in plan["plans"].values()] == [-1, -1]  # an H200 holds both whole
    planned = plan["planned_bytes"]
    assert planned == sum(p["gpu_bytes"] for p in plan["plans"].values()) > 0
    used = lambda p, free, when="load", n_gpu_layers=-1: gpu_check.offload_used(  # noqa: E731
        p, probe=lambda: (free, "nvidia-smi"), n_gpu_layers=n_gpu_layers, when=when)
    # The load took 0.9 of what was planned, the sweeps after it twice: judged on the most used.
    short = used(used(plan, 139 * GiB - int(planned * 0.9)), 139 * GiB - 2 * planned, "sweeps")
    assert short["used"] == {"load": int(planned * 0.9), "sweeps": 2 * planned} and short["planned_over_used"] == 0.5
    assert short["probe_after"] == "nvidia-smi"
    line = gpu_check.offload_line(short)
    assert "after the load, " in line and "after the sweeps (planned / most used 0.500: short by more than" in line
    near = used(plan, 139 * GiB - int(planned / 0.97))
    assert "(planned / most used 0.970: within the 5% of free VRAM the plan keeps spare)" in gpu_check.offload_line(near)
    # The threshold is exact: 0.949 is short though it would print as 0.95 with two places.
    assert "0.949: short" in gpu_check.offload_line(used(plan, 139 * GiB - int(planned / 0.949)))
    roomy = used(plan, 139 * GiB - planned // 2)
    assert roomy["planned_over_used"] == 2.0 and "short" not in gpu_check.offload_line(roomy)
    freed = used(plan, 140 * GiB)  # another program let go of memory meanwhile
    assert freed["planned_over_used"] is None and "no comparison" in gpu_check.offload_line(freed)
    # A load that did not put every layer on the GPU is not held against a whole plan.
    assert used(plan, GiB, n_gpu_layers=0)["planned_over_used"] is None
    assert "could not be read after the load" in gpu_check.offload_line(used(plan, None))
    # Little free VRAM: the target gets the last layers that fit, the draft what is left (none here).
    from localspec.engine.offload import VRAM_SPARE
    from localspec.models.fit import model_layers

    layers = model_layers(paths["target"])
    kv = layers.kv_bytes_per_cell * cfg.n_ctx
    tight_free = int((layers.compute_bytes + 1.5 * (layers.layer_bytes[-1] + kv)) / (1 - VRAM_SPARE))  # 1.5 layers' room
    tight = gpu_check.offload_plan(paths, cfg, offload_supported=True, probe=lambda: (tight_free, "nvml"))
    target = tight["plans"]["target"]
    assert target["offloaded"] == target["n_gpu_layers"] == 1 < target["n_layers"]
    assert tight["plans"]["draft"]["offloaded"] == 0
    assert f"{target['offloaded']} of {target['n_layers']} layers" in gpu_check.offload_line(tight)
    assert used(tight, 0)["planned_over_used"] is None
    # Nothing to plan: a CPU build, a layer count given, or no way to read free VRAM.
    assert "a CPU build" in gpu_check.offload_plan(paths, cfg, offload_supported=False, probe=lambda: (GiB, "nvml"))["skipped"]
    given = gpu_check.offload_plan(paths, RuntimeConfig(n_gpu_layers=20), offload_supported=True, probe=lambda: (GiB, "nvml"))
    assert given["skipped"].startswith("--n-gpu-layers 20: the product plans only for -1")
    unread = gpu_check.offload_plan(paths, cfg, offload_supported=True, probe=lambda: (None, "none"))
    assert used(unread, GiB) == unread
    assert "free VRAM could not be read (no NVML; nvidia-smi absent or no number from it)" in gpu_check.offload_line(unread)


def test_the_gpu_check_drives_the_engine_in_every_mode_and_writes_after_each(tiny_models):
    from localspec.engine.controller import Costs
    from tests.common import TEST_THREADS

    models = {"target": tiny_models["small-target"], "draft": tiny_models["small-draft"]}
    flat = Costs(verify=[0.010 + 0.0002 * n for n in range(17)], draft_step=0.002, draft_row=0.0001, pinned=True)
    written: list[list[str]] = []
    result = gpu_check.drive_engine(models, flat, n_gpu_layers=0, threads=TEST_THREADS, max_tokens=72,
                                    write=lambda r: written.append(list(r["runs"])))
    assert written[0] == ["off"] and written[-1] == list(gpu_check.ENGINE_MODES)  # one write per mode, in order
    runs = result["runs"]
    assert all(r["error"] is None and r["tokens"] > 0 for r in runs.values())
    assert "first_difference" not in runs["off"] and all("first_difference" in runs[m] for m in gpu_check.ENGINE_MODES[1:])
    # The word chain decides every greedy step by a wide margin: each mode gives off's answer, token
    # for token, and off's answer as the prediction is kept whole (100% acceptance).
    assert all(runs[m]["first_difference"] is None for m in gpu_check.ENGINE_MODES[1:])
    prediction = runs["prediction"]
    assert prediction["accepted"] == prediction["drafted"] == prediction["prediction_accepted"] >= 60
    draft = runs["draft"]  # the draft follows 70% of the successors: some of its tokens kept, not all
    assert 0.2 < draft["accepted"] / draft["drafted"] < 0.9
    assert runs["lookup"]["accepted"] > 0  # the answer repeats after CHAIN_CYCLE words, and lookup finds it
    calibration = {"machine": {"gpus": [], "gpu_offload": False, "llama_cpp_python": "x"},
                   "models": {"target": {"shape": "t", "recipe": "r"}, "draft": {"shape": "d"}},
                   "sweep": {"verify_by_rows": [0.01], "context": 48, "draft_by_rows": [0.001]},
                   "verify_ratio_to_one_row": [1.0], "sweep_long_context": {"verify_by_rows": []},
                   "engine_calibration": {"seconds": 1, "verify": [0.01], "draft_step": 0.001, "draft_row": 0.0001}}
    assert "the engine end to end" in gpu_check.render_summary(calibration, {"costs": {"sweep": []}, "engine": result}, 1.0)
    # A mode that raised is reported in the summary, and the check goes on (engine.json keeps the rest).
    failed = {"runs": {**result["runs"], "draft": {"finish": "error", "error": "RuntimeError: no luck"}}}
    assert "failed: RuntimeError: no luck" in gpu_check.render_summary(calibration, {"costs": {"sweep": []},
                                                                                    "engine": failed}, 1.0)


# ---------------------------------------------------------------- standalone app (slow, opt-in)

STANDALONE_APP = Path(os.environ.get("LOCALSPEC_STANDALONE_APP", REPO / "dist" / "localspec" / "localspec"))
standalone = pytest.mark.skipif(
    os.environ.get("LOCALSPEC_STANDALONE") != "1" or not STANDALONE_APP.is_file(),
    reason="opt-in: build with packaging/build-standalone.sh, then run with LOCALSPEC_STANDALONE=1",
)


def _app(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(STANDALONE_APP), *args], capture_output=True, text=True, timeout=timeout)


@standalone
def test_standalone_app_version_and_doctor():
    from localspec import __version__

    version = _app("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"localspec {__version__}"
    doctor = _app("doctor", "--json")
    assert doctor.returncode in (0, 1), doctor.stderr  # 1: a problem found (e.g. port in use)
    report = json.loads(doctor.stdout)
    lc = report["llama_cpp"]
    assert lc["version"] == "0.3.36" and lc["backends"] == ["CPU"] and lc["gpu_offload"] is False
    assert "CPU :" in lc["system_info"]  # a runtime-loaded CPU variant registered itself
    # Runtime dispatch: the CPU backends are separate modules beside the executable, and the
    # baseline x64 one needs nothing past SSE2, so the app starts on any x86-64 CPU.
    variants = {p.name for p in STANDALONE_APP.parent.glob("libggml-cpu-*.so")}
    assert {"libggml-cpu-x64.so", "libggml-cpu-haswell.so"} <= variants
    assert "loaded CPU backend from " + str(STANDALONE_APP.parent) in doctor.stderr


@standalone
def test_standalone_app_generates_on_the_cpu(target_path):
    out = _app("generate", "--no-pull", "--mode", "off", "--max-tokens", "8", "--threads", "2", "--n-ctx", "512",
               "--json", "def add(a, b):", timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    record = json.loads(out.stdout.strip().splitlines()[-1])
    assert record["finish_reason"] in ("length", "stop") and record["text"].strip()
    assert record["stats"]["completion_tokens"] >= 1


def _check_args(out: Path, work: Path, vocab: Path) -> list[str]:
    from tests.common import TEST_THREADS

    return ["--small", "--quick", "--out", str(out), "--work", str(work), "--vocab", str(vocab),
            "--bench", str(REPO / "docs" / "bench" / "quick.json"),
            "--predicted-bench", str(REPO / "docs" / "bench" / "predicted.json"),
            "--threads", str(TEST_THREADS), "--repeats", "1", "--engine-tokens", "16"]


def test_the_gpu_check_runs_every_step_on_the_small_shapes(tmp_path, draft_path):
    assert gpu_check.main(_check_args(tmp_path / "out", tmp_path / "work", draft_path)) == 0
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["calibration.json", "engine.json", "predictions.json", "summary.txt"]
    cal = json.loads((out / "calibration.json").read_text())
    assert len(cal["sweep"]["verify_by_rows"]) == 16 and cal["engine_calibration"]["k_max"] == 15
    assert cal["word_chain"]["cycle"] == gpu_check.CHAIN_CYCLE and cal["word_chain"]["words"] > 20000
    assert cal["offload"]["skipped"].startswith("llama.cpp offloads to no GPU here")  # this box's CPU build
    engine = json.loads((out / "engine.json").read_text())
    assert list(engine["runs"]) == list(gpu_check.ENGINE_MODES)
    assert set(engine["batch_flips"]["by_rows"]) == {str(n) for n in gpu_check.FLIP_SIZES}
    second = engine["second_target"]
    assert second["model"]["shape"] == "small-second" and len(second["verify_by_rows"]) == 16
    assert list(second["engine"]["runs"]) == ["off", "prediction"]
    assert second["engine"]["runs"]["prediction"]["first_difference"] is None  # off's answer, kept whole
    summary = (out / "summary.txt").read_text()
    assert "batch size and the argmax" in summary and "small-second: verify ms" in summary
    assert "weights: a word chain of" in summary
    assert "the product's GPU split: llama.cpp offloads to no GPU here" in summary


# What the GPU box has beside the standard library: numpy (its own) and what the bundle brings, the
# llama-cpp-python, gguf-py and localspec sources and gpu-bundle.sh's wheels (pydantic's own deps too).
BUNDLED_MODULES = ("numpy", "llama_cpp", "gguf", "localspec", "gpu_check", "synth_gguf", "pydantic", "pydantic_core",
                   "annotated_types", "typing_inspection", "typing_extensions", "diskcache", "jinja2", "markupsafe",
                   "platformdirs", "yaml", "_yaml")
ONLY_BUNDLED = """
import importlib.abc, importlib.machinery, sys, sysconfig
# The bundle's, the interpreter's own (private ones too: found in its stdlib directory), and what
# started with the interpreter (a site hook may import more of its own package later).
allowed = (set(sys.argv[1].split(",")) | set(sys.stdlib_module_names) | set(sys.builtin_module_names)
           | {name.partition(".")[0] for name in sys.modules})
stdlib = [sysconfig.get_paths()["stdlib"]]
class OnlyBundled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in allowed or importlib.machinery.PathFinder.find_spec(top, stdlib) is not None:
            return None
        raise ModuleNotFoundError(f"No module named {top!r} (the GPU bundle has no such module)", name=top)
sys.meta_path.insert(0, OnlyBundled())
sys.path.insert(0, sys.argv[2])
import gpu_check
from localspec.engine.runtime import RuntimeConfig
work, args = sys.argv[3], sys.argv[4:]
if gpu_check.main(args):
    sys.exit("the check failed")
# A CPU build plans no split: plan one as on a GPU, so that what the plan reads runs here too.
paths = {role: f"{work}/small-{role}-q4_k_m.gguf" for role in ("target", "draft")}
plan = gpu_check.offload_plan(paths, RuntimeConfig(), offload_supported=True, probe=lambda: (2**37, "given"))
plan = gpu_check.offload_used(plan, probe=gpu_check.read_vram, n_gpu_layers=-1, when="load")
assert all(plan["plans"].values()), plan
assert "load" in plan["used"] or "could not be read after the load" in plan["error"], plan  # a GPU here, or none
"""


def test_the_gpu_check_needs_nothing_the_bundle_does_not_bring(tmp_path, draft_path):
    # On the device a module the bundle lacks stops the run in its first second (platformdirs and
    # yaml did, through localspec.models, when the check first planned the product's GPU split).
    bundle = (REPO / "packaging" / "gpu-bundle.sh").read_text()
    for wheel in ("platformdirs==", "pyyaml==", "pydantic==", "pydantic-core==", "jinja2==", "markupsafe==",
                  "diskcache==", "typing-extensions==", "annotated-types==", "typing-inspection=="):
        assert f'"{wheel}$(ver ' in bundle, wheel
    assert "platformdirs:platformdirs yaml:pyyaml" in (REPO / "packaging" / "gpu-check.sh").read_text()  # installed there
    args = _check_args(tmp_path / "out", tmp_path / "work", draft_path)
    r = subprocess.run([sys.executable, "-c", ONLY_BUNDLED, ",".join(BUNDLED_MODULES), str(REPO / "packaging"),
                        str(tmp_path / "work"), *args], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "failed" not in (tmp_path / "out" / "summary.txt").read_text()  # no step was lost to a missing module


def test_a_step_that_raises_is_recorded_and_the_second_target_waits_for_time(tmp_path, draft_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no luck")

    monkeypatch.setattr(gpu_check, "batch_flips", broken)
    args = [*_check_args(tmp_path / "out", tmp_path / "work", draft_path), "--deadline-s", "0", "--flat"]
    assert gpu_check.main(args) == 0
    assert json.loads((tmp_path / "out" / "calibration.json").read_text())["word_chain"] is None  # --flat: all random
    engine = json.loads((tmp_path / "out" / "engine.json").read_text())
    assert engine["batch_flips"] == {"error": "RuntimeError: no luck"}
    assert list(engine["runs"]) == list(gpu_check.ENGINE_MODES)  # the steps around it ran
    assert engine["second_target"]["skipped"].startswith("0 s left of the budget")
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "batch flips: failed: RuntimeError: no luck" in summary and "the second target: skipped" in summary
    assert not list((tmp_path / "out").glob("*.tmp"))  # every write was whole


def test_the_gpu_check_keeps_the_steps_done_when_a_later_one_fails(tmp_path, draft_path, monkeypatch):
    from localspec.engine import calibrate

    def broken(*args, **kwargs):
        raise RuntimeError("the engine's calibration broke")

    monkeypatch.setattr(calibrate, "measure", broken)
    with pytest.raises(RuntimeError, match="calibration broke"):
        gpu_check.main(_check_args(tmp_path / "out", tmp_path / "work", draft_path))
    cal = json.loads((tmp_path / "out" / "calibration.json").read_text())
    assert len(cal["sweep"]["verify_by_rows"]) == 16 and "engine_calibration" not in cal
