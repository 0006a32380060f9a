"""packaging/install.py's backend decision on simulated machines, its dry run, and service units."""

from __future__ import annotations

import importlib.util
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
    return ServiceSpec(executable=["/opt/ls env/bin/localspec"], port=8123, profile="default",
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
