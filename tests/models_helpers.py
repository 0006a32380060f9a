"""Helpers for the model-manager tests: tiny wheels, overlay registries, subprocess runs."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def tmp_store(tmp_path, monkeypatch) -> Path:
    """A private model store: tests that install fake models never touch the shared one."""
    store = tmp_path / "store"
    monkeypatch.setenv("LOCALSPEC_MODELS_DIR", str(store))
    return store


def overlay_path() -> Path:
    from localspec.paths import resolve_paths

    return resolve_paths().user_registry


def write_overlay(text: str) -> Path:
    p = overlay_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_wheel(directory: Path, dist: str, version: str, parts: dict[str, bytes]) -> Path:
    """A minimal wheel holding ``<pkg>/data/<part>`` members, like the mirror's model packages."""
    directory.mkdir(parents=True, exist_ok=True)
    pkg = dist.replace("-", "_")
    whl = directory / f"{pkg}-{version}-py3-none-any.whl"
    info = f"{pkg}-{version}.dist-info"
    members = {f"{pkg}/__init__.py": b""}
    members.update({f"{pkg}/data/{name}": data for name, data in parts.items()})
    members[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode()
    members[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: localspec-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = "".join(f"{n},,\n" for n in members) + f"{info}/RECORD,,\n"
    members[f"{info}/RECORD"] = record.encode()
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return whl


def toml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def pypi_source_toml(packages: list[str], wheel_dir: Path, name: str, data: bytes | None,
                     sha: str | None = None) -> str:
    size = f", size = {len(data)}" if data is not None else ""
    digest = sha or (sha256(data) if data is not None else None)
    h = f', sha256 = "{digest}"' if digest else ""
    return (
        "  [[models.sources]]\n"
        '  kind = "pypi"\n'
        f"  packages = {toml_list(packages)}\n"
        f"  pip_args = {toml_list(['--no-index', '--find-links', str(wheel_dir)])}\n"
        f'  files = [{{ name = "{name}"{size}{h} }}]\n'
    )


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def hub_env(hub_url: str, hf_home: Path) -> dict[str, str]:
    """A CLI subprocess's environment against a fake Hub: short timeouts, no token, not offline."""
    env = subprocess_env(HF_ENDPOINT=hub_url, HF_HOME=str(hf_home), HF_HUB_DISABLE_TELEMETRY="1",
                         HF_HUB_ETAG_TIMEOUT="5", HF_HUB_DOWNLOAD_TIMEOUT="5")
    env.pop("HF_TOKEN", None)
    env.pop("HF_HUB_OFFLINE", None)
    return env


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localspec", *args], capture_output=True, text=True,
                          env=env or subprocess_env(), timeout=timeout, cwd=REPO)


PULL_SCRIPT = r"""
import json, sys
from localspec.errors import LocalspecError
from localspec.models import ModelManager
events = []
try:
    rec = ModelManager().pull(sys.argv[1], progress=events.append)
    out = {"ok": True, "path": str(rec.path), "source": rec.source, "downloaded": rec.downloaded}
except LocalspecError as exc:
    out = {"ok": False, "type": type(exc).__name__, "cause": exc.cause}
out["events"] = [[e.source, e.phase, e.bytes_done, e.bytes_total] for e in events]
print(json.dumps(out))
"""


def pull_in_subprocess(model_id: str, env: dict[str, str], timeout: float = 120) -> dict:
    """huggingface-hub reads HF_ENDPOINT/HF_HUB_OFFLINE at import: a fresh interpreter per pull."""
    proc = subprocess.run([sys.executable, "-c", PULL_SCRIPT, model_id], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])
