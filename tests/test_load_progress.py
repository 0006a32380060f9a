"""Set-up work is visible: llama.cpp's model-load progress and the one-time calibration reach a
face's `on_progress`, and `localspec generate` shows them on stderr (stdout stays the answer)."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys

import pytest

from localspec.cli.load_progress import LoadProgressDisplay
from localspec.engine import calibrate
from localspec.engine.events import LoadProgress, LoadStage, StageReporter
from localspec.engine.runtime import ModelRuntime, RuntimeConfig
from tests.common import DRAFT_ID, REPO, TARGET_ID, TEST_THREADS

CONFIG = RuntimeConfig(n_ctx=256, n_threads=TEST_THREADS)


# ---------------------------------------------------------------------- without models


def test_a_stage_is_timed_throttled_and_ends_once():
    now = [10.0]
    seen: list[LoadProgress] = []
    reporter = StageReporter(seen.append, LoadStage.LOAD_MODEL, "m", clock=lambda: now[0])
    for fraction in (0.0, 0.001, 0.004, 0.5, 1.0, 1.0):  # llama.cpp reports per tensor
        now[0] += 0.5
        reporter.report(fraction)
    assert [p.fraction for p in seen] == [0.0, 0.5, 1.0]
    assert [p.elapsed_s for p in seen] == [0.5, 2.0, 2.5]
    assert seen[-1].finished and not seen[0].finished


def test_a_failing_callback_is_silenced_not_raised():
    calls = []

    def broken(progress: LoadProgress) -> None:
        calls.append(progress)
        raise RuntimeError("the face is gone")

    reporter = StageReporter(broken, LoadStage.CALIBRATE, "m")
    reporter.report(0.0)  # no exception escapes into llama.cpp's loader
    reporter.report(0.5)
    assert len(calls) == 1


def test_plain_output_is_a_start_and_an_end_line_per_stage():
    out = io.StringIO()
    with LoadProgressDisplay(out, tty=False) as show:
        for fraction in (0.0, 0.3, 0.7, 1.0):
            show(LoadProgress(LoadStage.LOAD_MODEL, TARGET_ID, fraction, fraction * 2))
        for fraction in (0.0, 0.5, 1.0):
            show(LoadProgress(LoadStage.CALIBRATE, TARGET_ID, fraction, fraction * 12.34))
    assert out.getvalue().splitlines() == [
        f"loading {TARGET_ID}…", f"loaded {TARGET_ID} in 2.0 s",
        "calibrating speculative costs (one-time)…", "calibrated in 12.3 s",
    ]


def test_the_terminal_line_shows_model_names_as_written():
    out = io.StringIO()
    odd = "why[/]b[@click=app.quit]x"
    with LoadProgressDisplay(out, tty=True) as show:
        for fraction in (0.0, 0.5, 1.0):
            show(LoadProgress(LoadStage.LOAD_MODEL, odd, fraction, 1.5))
    assert f"loaded {odd} in 1.5 s" in out.getvalue()


# ---------------------------------------------------------------------- real llama.cpp


@pytest.mark.models
def test_llama_cpp_reports_the_model_load(draft_path):
    seen: list[LoadProgress] = []
    rt = ModelRuntime(draft_path, CONFIG, on_progress=seen.append)
    try:
        assert rt.tokenize("hello")  # loaded and usable
    finally:
        rt.close()
    assert {(p.stage, p.model) for p in seen} == {(LoadStage.LOAD_MODEL, DRAFT_ID)}
    fractions = [p.fraction for p in seen]
    assert fractions[0] == 0.0 and fractions[-1] == 1.0 and fractions == sorted(fractions)
    assert 3 <= len(fractions) <= 102  # progress, throttled to whole percents
    assert [p.elapsed_s for p in seen] == sorted(p.elapsed_s for p in seen)


@pytest.mark.models
def test_a_broken_progress_callback_does_not_stop_the_load(draft_path):
    def broken(_progress: LoadProgress) -> None:
        raise ValueError("face bug")

    rt = ModelRuntime(draft_path, CONFIG, on_progress=broken)
    try:
        assert rt.n_vocab > 0 and rt.tokenize("hello")
    finally:
        rt.close()


@pytest.mark.models
def test_calibration_reports_each_round_and_nothing_once_cached(draft_path, tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="localspec.engine.calibrate")
    # A busy box's calibration is (rightly) not saved; this test is about reporting and the cache.
    monkeypatch.setattr(calibrate, "SPREAD_LIMIT", float("inf"))
    monkeypatch.setattr(calibrate, "STEP_DRIFT_LIMIT", float("inf"))
    rt = ModelRuntime(draft_path, CONFIG)
    seen: list[LoadProgress] = []
    try:
        # k_max 3 measures target batches of 1..4 rows in 4 rounds, then the draft's step and row costs.
        calibrate.load_or_measure(rt, rt, 3, tmp_path, on_progress=seen.append)
        again: list[LoadProgress] = []
        calibrate.load_or_measure(rt, rt, 3, tmp_path, on_progress=again.append)
    finally:
        rt.close()
    assert [round(p.fraction, 3) for p in seen] == [round(i / 6, 3) for i in range(7)]
    assert {(p.stage, p.model) for p in seen} == {(LoadStage.CALIBRATE, DRAFT_ID)}
    assert seen[-1].elapsed_s > 0 and again == []
    assert [r.message for r in caplog.records if r.message.startswith("calibrated in ")]  # for `serve`'s log


@pytest.mark.models
def test_generate_shows_the_set_up_on_stderr_and_keeps_json_on_stdout(target_path, draft_path, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "LOCALSPEC_CALIBRATION_DIR": str(tmp_path / "calibration")}
    run = subprocess.run(
        [sys.executable, "-m", "localspec", "generate", "def add(a, b):", "--json", "--max-tokens", "4",
         "--mode", "auto", "--n-ctx", "512", "--threads", str(TEST_THREADS), "--no-pull"],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    record = json.loads(run.stdout)  # stdout is exactly the JSON object
    assert record["stats"]["mode"] == "auto" and record["finish_reason"] in ("stop", "length")
    lines = run.stderr.splitlines()
    for model in (TARGET_ID, DRAFT_ID):
        assert f"loading {model}…" in lines
        assert any(line.startswith(f"loaded {model} in ") and line.endswith(" s") for line in lines), lines
    assert "calibrating speculative costs (one-time)…" in lines
    assert any(line.startswith("calibrated in ") and line.endswith(" s") for line in lines), lines
