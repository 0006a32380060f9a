"""Shared fixtures.

Every test runs with LOCALSPEC_HOME in a temp dir, so nothing writes to the user's config or
data. The model store is the exception: LOCALSPEC_MODELS_DIR keeps pointing at the shared store
(the one CI fills with `localspec models pull`), so the real models are downloaded once.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Re-exported for modules not yet moved to tests.common (the TUI's); new code imports from there.
from tests.common import (  # noqa: F401
    DRAFT_ID, EMBEDDING_ID, PULL_EMBEDDING, PULL_PAIR, REPO, SHARED_STORE, TARGET_ID, TEST_THREADS, plain_scope,
)

# pytest-xdist's workers export COLUMNS=80; a test sees the output a pipe gets unless it sets a width.
os.environ.pop("COLUMNS", None)

# Fixtures that load real model files: a test using one, directly or through another fixture, is
# stage 2 (`-m models`) whether or not it says so, so the marker cannot be forgotten.
MODEL_FIXTURES = frozenset({"target_path", "draft_path", "minilm_path", "embedder"})


def pytest_collection_modifyitems(config, items) -> None:
    """Stage 2 is `models`: every test that uses a model fixture, and every `slow` campaign.

    `pytest -m "not models"` is then the fast suite and `pytest -m models` the rest; a test is in
    exactly one of them."""
    for item in items:
        uses_models = MODEL_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if (uses_models or item.get_closest_marker("slow")) and not item.get_closest_marker("models"):
            item.add_marker(pytest.mark.models)


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
    from localspec.engine.calibrate import forget_learned

    forget_learned()  # each test reads the calibration dir afresh: a scripted test's curve never reaches another
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

