"""`localspec doctor` on this machine: schema, a CPU-only build reported as such, models, port."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import llama_cpp
import pytest

from tests.common import SHARED_STORE
from localspec.doctor import SCHEMA, compiled_backends, diagnose, parse_nvidia_smi


def _doctor_json(*args: str, env: dict | None = None) -> tuple[int, dict]:
    out = subprocess.run([sys.executable, "-m", "localspec", "doctor", "--json", *args],
                         capture_output=True, text=True, timeout=120, env=env)
    return out.returncode, json.loads(out.stdout)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    # One subprocess for the module, in its own home (the autouse home is per test), shared store.
    home = tmp_path_factory.mktemp("doctor-home")
    env = {**os.environ, "LOCALSPEC_HOME": str(home), "LOCALSPEC_MODELS_DIR": str(SHARED_STORE)}
    rc, data = _doctor_json("--port", str(_free_port()), env=env)
    data["_rc"] = rc
    data["_home"] = str(home)
    return data


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_schema(report):
    assert report["schema"] == SCHEMA
    for key in ("localspec", "llama_cpp", "gpu", "paths", "settings", "models", "default_profile", "embedding",
                "port", "problems", "ok"):
        assert key in report
    for p in report["problems"]:
        assert p["cause"] and p["fix"]
    assert report["ok"] == (not report["problems"]) and report["_rc"] == (0 if report["ok"] else 1)


def test_cpu_build_reports_no_gpu_offload(report):
    lc = report["llama_cpp"]
    assert lc["version"] == llama_cpp.__version__
    assert lc["gpu_offload"] is bool(llama_cpp.llama_supports_gpu_offload())
    if not lc["gpu_offload"]:  # this CPU machine and CI
        assert lc["gpu_offload_note"].startswith("no:")
        assert "CPU" in lc["backends"] and not {"CUDA", "Metal", "Vulkan", "HIP"} & set(lc["backends"])
    assert lc["system_info"] == llama_cpp.llama_print_system_info().decode().strip()


def test_gpu_devices_are_probed_never_guessed(report):
    gpu = report["gpu"]
    if importlib.util.find_spec("pynvml") is None and shutil.which("nvidia-smi") is None:
        assert gpu == {"probe": "none", "devices": "unknown", "note": gpu["note"]}
    else:
        assert gpu["probe"] in ("nvml", "nvidia-smi") and isinstance(gpu["devices"], list)


def test_paths_and_port(report):
    home = Path(report["_home"])
    assert report["paths"]["config_dir"] == str(home / "config")
    assert report["paths"]["data_dir"] == str(home / "data")
    assert report["port"]["free"] is True


def test_installed_models_and_default_profile_fit(report, target_path, draft_path):
    states = {m["id"]: m["state"] for m in report["models"]}
    assert states["qwen2.5-coder-1.5b-instruct-q4_k_m"] == "size-checked"
    fit = report["default_profile"]["fit"]
    assert fit["verdict"] in ("fits in VRAM", "fits in RAM", "too large")
    assert fit["total_bytes"] > target_path.stat().st_size + draft_path.stat().st_size
    if not report["llama_cpp"]["gpu_offload"]:
        assert fit["verdict"] != "fits in VRAM"


def test_busy_port_is_a_problem_with_a_fix():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = diagnose(port=port).to_dict()
    assert r["port"] == {"host": "127.0.0.1", "port": port, "free": False}
    assert any(f"--port {port + 1}" in p["fix"] for p in r["problems"])


def test_the_port_checked_is_the_one_serve_would_use(isolated_home, capsys):
    """Without --port, doctor checked 8000 whatever settings.toml's [server] port said."""
    from localspec.cli import main

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        settings = isolated_home / "config" / "settings.toml"
        settings.parent.mkdir(parents=True, exist_ok=True)
        settings.write_text(f"[server]\nport = {port}\n")
        main(["doctor", "--json"])
    r = json.loads(capsys.readouterr().out)
    assert r["port"] == {"host": "127.0.0.1", "port": port, "free": False}


def test_an_ipv6_host_is_checked_as_the_server_binds_it():
    """port_free bound IPv4 sockets only: "::1", which serve takes, was "Invalid --host"."""
    from localspec.doctor import port_free

    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    assert port_free("::1", 0) and port_free("[::1]", 0)


def test_a_host_from_the_settings_that_cannot_be_bound_names_the_settings_not_a_flag(isolated_home, capsys):
    from localspec.cli import main

    settings = isolated_home / "config" / "settings.toml"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text('[server]\nhost = "no.such.host.invalid"\n')
    assert main(["doctor"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {settings}: [server] host 'no.such.host.invalid'") and "--host" not in err.splitlines()[0]


@pytest.mark.parametrize("flag, value, says", [
    ("--port", "70000", "Invalid --port 70000: a port is 0 to 65535."),
    ("--port", "-1", "Invalid --port -1: a port is 0 to 65535."),
    ("--host", "no.such.host.invalid", "Invalid --host 'no.such.host.invalid': "),
    ("--host", "192.0.2.1", "Invalid --host '192.0.2.1': it is not an address of this machine."),  # TEST-NET-1
])
def test_a_port_or_host_no_server_could_bind_is_a_usage_error(capsys, flag, value, says):
    from localspec.cli import main

    assert main(["doctor", flag, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {says}") and len(err.splitlines()) == 2 and "  fix: " in err


@pytest.mark.parametrize("text, says", [
    ("profile = \n", "Invalid value"),
    ("[engine]\nn_ctx = -5\n", "setting 'engine.n_ctx'"),
    ("[server]\nport = 99999\n", "setting 'server.port'"),
    ('profile = "nope"\n', "setting 'profile': Unknown profile 'nope'."),
])
def test_settings_every_command_refuses_are_a_problem(isolated_home, text, says):
    settings = isolated_home / "config" / "settings.toml"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(text)
    r = diagnose(port=_free_port()).to_dict()
    assert r["ok"] is False and r["settings"]["ok"] is False and says in r["settings"]["error"]
    assert any(p["cause"].startswith(f"{settings}: ") and says in p["cause"] and p["fix"] for p in r["problems"])


def test_the_fit_is_the_active_profiles(isolated_home):
    settings = isolated_home / "config" / "settings.toml"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text('profile = "qwen-7b"\n')
    r = diagnose(port=_free_port()).to_dict()
    assert r["settings"] == {"file": str(settings), "ok": True, "error": None, "profile": "qwen-7b"}
    assert r["default_profile"]["name"] == "qwen-7b"


def test_a_broken_overlay_is_one_problem_and_the_rest_is_reported(isolated_home):
    (isolated_home / "config").mkdir(parents=True, exist_ok=True)
    (isolated_home / "config" / "settings.toml").write_text('profile = "qwen-7b"\n')
    (isolated_home / "config" / "models.toml").write_bytes(b'a = "caf\xe9"\n')
    r = diagnose(port=_free_port()).to_dict()
    assert [p["cause"] for p in r["problems"]] == [
        f"Cannot read {isolated_home / 'config' / 'models.toml'}: it is not UTF-8 (byte 0xe9 at offset 8)."]
    assert r["settings"]["ok"] is True and r["port"]["free"] is True


def test_reset_without_calibration_removes_nothing(tmp_path, monkeypatch, capsys):
    from localspec.cli import main

    monkeypatch.setenv("LOCALSPEC_CALIBRATION_DIR", str(tmp_path))  # never the session's shared curves
    curve = tmp_path / "calibration-kept.json"
    curve.write_text("{}")
    assert main(["doctor", "--reset"]) == 2
    assert capsys.readouterr().err.startswith("error: --reset removes the calibration curves, and only with "
                                              "--calibration.")
    assert curve.exists()
    assert main(["doctor", "--calibration", "--reset"]) == 0 and not curve.exists()


def test_verify_rehashes_and_reports_a_corrupt_model(tmp_path, monkeypatch, minilm_path):
    monkeypatch.setenv("LOCALSPEC_MODELS_DIR", str(tmp_path / "store"))
    from localspec.models import ModelManager

    rec = ModelManager().import_file(minilm_path, model_id="doctor-test-emb", role="embedding")
    rows = {m["id"]: m for m in diagnose(verify=True).to_dict()["models"]}
    assert rows["doctor-test-emb"]["state"] == "verified"
    with open(rec.path, "r+b") as f:  # same size, different bytes: only a re-hash notices
        f.seek(4096)
        byte = f.read(1)
        f.seek(4096)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert {m["id"]: m for m in diagnose().to_dict()["models"]}["doctor-test-emb"]["state"] == "size-checked"
    r = diagnose(verify=True).to_dict()
    assert {m["id"]: m for m in r["models"]}["doctor-test-emb"]["state"] == "corrupt"
    assert any("doctor-test-emb" in p["cause"] and "pull doctor-test-emb --force" in p["fix"] for p in r["problems"])
    # The default profile is not in this empty store: each missing model is a problem with its fix.
    assert any("not installed" in p["cause"] and "models pull" in p["fix"] for p in r["problems"])


def test_text_output_says_whether_gpu_offload_works():
    out = subprocess.run([sys.executable, "-m", "localspec", "doctor", "--port", str(_free_port())],
                         capture_output=True, text=True, timeout=120)
    offload = bool(llama_cpp.llama_supports_gpu_offload())
    assert ("GPU offload: yes" if offload else "GPU offload: no") in out.stdout


def test_backend_and_device_parsers_on_other_machines_output():
    libs = ["libggml-base.so", "libggml-cpu-haswell.so", "libggml-cpu-skylakex.so", "libggml-cuda.so", "libllama.so"]
    assert compiled_backends(libs, "CUDA : ARCHS = 900 | CPU : AVX2 = 1 |") == ["CPU", "CUDA"]
    devs = parse_nvidia_smi("0, NVIDIA H200, 143771, 140000, 9.0\n1, NVIDIA A10, 23028, 22000, [N/A]\n")
    assert devs[0] == {"index": 0, "name": "NVIDIA H200", "memory_total": 143771 << 20,
                       "memory_free": 140000 << 20, "compute_capability": "9.0"}
    assert devs[1]["compute_capability"] is None
