"""Each face's path into the metrics log: TUI and API (engine in-process, as those faces drive it,
over a scripted model pair from tests/fake_tier.py) and CLI (`localspec generate` in a subprocess,
with the real models)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from localspec.cli import main
from localspec.engine.config import GenerationRequest
from localspec.engine.events import Done
from localspec.engine.scheduler import Engine
from localspec.metrics import Metrics, RequestRecord, fetch_rows, open_reader
from tests.common import DRAFT_ID, REPO, TARGET_ID, TEST_THREADS
from tests.fake_tier import scripted, scripted_engine

SAYS = scripted(default="    return a + b\n\nprint(add(1, 2))\n")


@pytest.fixture(scope="module")
def engine():
    eng = scripted_engine(script=SAYS, draft_script=SAYS, mode="draft", parallel=1)
    yield eng
    eng.close()


def _run(engine: Engine, request: GenerationRequest) -> tuple[Done, float]:
    t0 = time.perf_counter()
    done = [e for e in engine.generate(request) if isinstance(e, Done)][0]
    return done, (time.perf_counter() - t0) * 1000


def _rows(db) -> dict[str, dict]:
    conn = open_reader(db)
    try:
        return {r["request_id"]: r for r in fetch_rows(conn)}
    finally:
        conn.close()


def test_tui_and_api_requests_are_logged_with_their_fields(engine, tmp_path):
    db = tmp_path / "metrics.sqlite"
    code = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
    with Metrics(db) as m:
        tui_done, tui_ms = _run(engine, GenerationRequest(prompt=code * 2 + "def fibonacci(n):", max_tokens=8))
        m.record(RequestRecord.from_stats(
            tui_done.stats, face="tui", profile="default", target_model=TARGET_ID, draft_model=DRAFT_ID,
            finish_reason=tui_done.finish_reason, e2e_ms=tui_ms, request_id="tui-1", prompt_text="not kept",
        ))
        api_done, api_ms = _run(engine, GenerationRequest(
            messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, mode="off"))
        m.record(RequestRecord.from_stats(
            api_done.stats, face="api", profile="default", target_model=TARGET_ID, finish_reason=api_done.finish_reason,
            e2e_ms=api_ms, request_id="api-1", route="target", route_reason="default", cache="miss",
            cache_similarity=0.31,
        ))
        assert m.flush(timeout=60)
        prom = {f.name: f for f in text_string_to_metric_families(generate_latest(m.registry).decode())}
    rows = _rows(db)
    tui, api = rows["tui-1"], rows["api-1"]
    ts = tui_done.stats
    assert (tui["face"], tui["spec_mode"], tui["target_model"], tui["draft_model"]) == ("tui", "draft", TARGET_ID,
                                                                                        DRAFT_ID)
    assert tui["completion_tokens"] == ts.completion_tokens == 8 and tui["finish_reason"] == "length"
    assert tui["prompt_tokens"] == ts.prompt_tokens > 0
    assert (tui["drafted"], tui["accepted"]) == (ts.drafted, ts.accepted) and ts.drafted > 0
    assert tui["ttft_ms"] == pytest.approx(ts.ttft_ms) and tui["decode_tps"] == pytest.approx(ts.tokens_per_second)
    assert tui["e2e_ms"] >= tui["ttft_ms"] and tui["compute_s"] > 0 and tui["prompt_text"] is None
    assert tui["mean_accepted_length"] == pytest.approx(ts.mean_accepted_length)
    assert (api["face"], api["spec_mode"], api["drafted"], api["route"], api["cache"]) == ("api", "off", 0, "target",
                                                                                           "miss")
    assert api["completion_tokens"] == api_done.stats.completion_tokens > 0
    assert api["cache_similarity"] == pytest.approx(0.31) and api["draft_model"] is None
    drafted = sum(s.value for s in prom["localspec_spec_drafted_tokens"].samples if s.name.endswith("_total"))
    assert drafted == ts.drafted


def test_generation_runs_while_another_connection_holds_the_write_lock(engine, tmp_path):
    db = tmp_path / "metrics.sqlite"
    m = Metrics(db)
    blocker = sqlite3.connect(db, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        for i in range(2):
            done, ms = _run(engine, GenerationRequest(prompt=f"# step {i}\nx = ", max_tokens=4))
            m.record(RequestRecord.from_stats(done.stats, face="api", finish_reason=done.finish_reason, e2e_ms=ms,
                                              request_id=f"r{i}"))
        assert done.stats.completion_tokens > 0
        assert blocker.execute("SELECT count(*) FROM requests").fetchone()[0] == 0
        blocker.execute("COMMIT")
        assert m.flush(timeout=60)
    finally:
        blocker.close()
        m.close()
    assert set(_rows(db)) == {"r0", "r1"}


def test_cli_generate_is_logged_and_shown_by_stats(target_path, draft_path, isolated_home, capsys):
    from localspec.models import ModelManager

    env = dict(os.environ, LOCALSPEC_HOME=str(isolated_home))  # conftest set LOCALSPEC_MODELS_DIR already
    proc = subprocess.run(
        [sys.executable, "-m", "localspec", "generate", "def add(a, b):", "--max-tokens", "8", "--threads",
         str(TEST_THREADS), "--mode", "draft", "--n-ctx", "1024", "--no-pull"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert "not logged" not in proc.stderr
    db = isolated_home / "data" / "metrics.sqlite"
    rows = list(_rows(db).values())
    assert len(rows) == 1
    r = rows[0]
    mm = ModelManager()
    assert (r["face"], r["profile"], r["target_model"], r["draft_model"]) == ("cli", "default", TARGET_ID, DRAFT_ID)
    assert r["target_hash"] == mm.manifest(TARGET_ID).files[0].sha256
    assert r["draft_hash"] == mm.manifest(DRAFT_ID).files[0].sha256
    assert (r["spec_mode"], r["completion_tokens"], r["finish_reason"]) == ("draft", 8, "length")
    assert r["drafted"] > 0 and r["prompt_tokens"] > 0 and r["e2e_ms"] > 0 and r["error_class"] is None
    assert r["prompt_text"] is None

    assert main(["stats", "--by", "model"]) == 0
    out = capsys.readouterr().out
    assert TARGET_ID in out and " 1 " in out
