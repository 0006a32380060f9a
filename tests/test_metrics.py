"""Metrics log, Prometheus collectors, drift and `localspec stats`, on real SQLite files (no models)."""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from localspec.cli import main
from localspec.engine.events import Stats
from localspec.metrics import (
    SCHEMA_VERSION,
    DriftLimits,
    Metrics,
    MetricsSettings,
    RequestRecord,
    active_drift_flags,
    compare,
    detect_drift,
    fetch_rows,
    load_metrics_settings,
    open_reader,
    spend,
    summarize,
)

DAY = 86400.0


def _stats(mode: str = "draft", drafted: int = 8, accepted: int = 6, tps: float = 20.0, ttft_ms: float = 100.0,
           completion: int = 11) -> Stats:
    s = Stats(mode=mode, prompt_tokens=30, reused_prefix_tokens=10, prefill_ms=ttft_ms * 0.9, ttft_ms=ttft_ms,
              completion_tokens=completion, decode_ms=(completion - 1) / tps * 1000 if tps else 0.0,
              target_passes=4 if drafted else completion - 1)
    # Two drafts of drafted/2 tokens each, accepting `accepted` in total.
    half = drafted // 2
    if drafted:
        s.record_position(half, min(accepted, half))
        s.record_position(drafted - half, max(accepted - half, 0))
    s.drafted, s.accepted = drafted, accepted
    return s


def _rows(db: Path) -> list[dict]:
    conn = open_reader(db)
    try:
        return fetch_rows(conn)
    finally:
        conn.close()


@pytest.fixture
def db(tmp_path) -> Path:
    return tmp_path / "metrics.sqlite"


def test_default_db_lives_in_the_data_dir_and_uses_wal(isolated_home):
    with Metrics() as m:
        m.record(RequestRecord.from_stats(_stats(), face="tui", finish_reason="stop"))
        assert m.flush()
    path = isolated_home / "data" / "metrics.sqlite"
    assert m.db_path == path and path.exists()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()


def test_record_fields_round_trip_and_prompt_text_is_opt_in(db):
    stats = _stats(drafted=8, accepted=5)
    rec = RequestRecord.from_stats(
        stats, face="api", profile="default", target_model="t-1", draft_model="d-1", finish_reason="length",
        e2e_ms=900.0, request_id="req-1", route="target", route_reason="long prompt", cache="miss",
        cache_similarity=0.42, prompt_text="secret prompt", model_hashes={"target": "aa" * 32, "draft": "bb" * 32},
    )
    with Metrics(db) as m:
        m.record(rec)
        m.record(RequestRecord.from_stats(stats, face="cli", prompt_text="also secret", request_id="req-2"))
        assert m.flush()
    with Metrics(db, store_prompts=True) as m:
        m.record(RequestRecord.from_stats(stats, face="tui", prompt_text="kept", request_id="req-3"))
        assert m.flush()
    rows = {r["request_id"]: r for r in _rows(db)}
    r = rows["req-1"]
    assert (r["face"], r["profile"], r["target_model"], r["draft_model"]) == ("api", "default", "t-1", "d-1")
    assert (r["target_hash"], r["draft_hash"]) == ("aa" * 32, "bb" * 32)
    assert (r["route"], r["route_reason"], r["cache"], r["cache_similarity"]) == ("target", "long prompt", "miss", 0.42)
    assert (r["prompt_tokens"], r["reused_tokens"], r["completion_tokens"]) == (30, 10, 11)
    assert r["prefill_ms"] == pytest.approx(90.0) and r["ttft_ms"] == pytest.approx(100.0)
    assert r["decode_tps"] == pytest.approx(20.0) and r["e2e_ms"] == pytest.approx(900.0)
    assert (r["spec_mode"], r["drafted"], r["accepted"], r["finish_reason"]) == ("draft", 8, 5, "length")
    assert json.loads(r["drafted_by_position"]) == [2, 2, 2, 2]
    assert json.loads(r["accepted_by_position"]) == [2, 1, 1, 1]
    assert r["mean_accepted_length"] == pytest.approx(10 / 4)
    assert r["compute_s"] == pytest.approx((90.0 + 500.0) / 1000)
    assert r["prompt_text"] is None and rows["req-2"]["prompt_text"] is None
    assert rows["req-3"]["prompt_text"] == "kept"
    back = RequestRecord.from_row(r)
    assert back.accepted_by_position == [2, 1, 1, 1] and back.cache_similarity == 0.42


def test_feedback_is_joined_to_its_request(db):
    with Metrics(db) as m:
        m.record(RequestRecord.from_stats(_stats(), face="api", request_id="a", cache="hit"))
        m.record(RequestRecord.from_stats(_stats(), face="api", request_id="b"))
        m.feedback("a", -1, "thumbs")
        m.feedback("a", 0, "cache_wrong")
        m.feedback("b", 1, "thumbs")
        assert m.flush()
    rows = {r["request_id"]: r for r in _rows(db)}
    assert rows["a"]["feedback_score"] == -1 and rows["a"]["cache_wrong"] == 1
    assert rows["b"]["feedback_score"] == 1 and rows["b"]["cache_wrong"] == 0


def test_retention_prunes_old_requests_and_their_feedback(db):
    now = time.time()
    with Metrics(db) as m:
        for i, age_days in enumerate((40, 31, 29, 1)):
            m.record(RequestRecord(face="api", request_id=f"r{i}", ts=now - age_days * DAY))
            m.feedback(f"r{i}", 1, "thumbs")
        assert m.flush()
    with Metrics(db, retention_days=30) as m:
        assert m.flush()
        m.prune(now=now)  # the writer pruned on start too; either way the old rows are gone
    assert [r["request_id"] for r in _rows(db)] == ["r2", "r3"]
    conn = sqlite3.connect(db)
    assert sorted(x[0] for x in conn.execute("SELECT request_id FROM feedback")) == ["r2", "r3"]
    conn.close()


def test_writer_prunes_on_start_without_being_asked(db):
    old = time.time() - 100 * DAY
    with Metrics(db) as m:
        m.record(RequestRecord(face="cli", request_id="old", ts=old))
        assert m.flush()
    with Metrics(db, retention_days=7) as m:
        m.record(RequestRecord(face="cli", request_id="new"))
        assert m.flush()
    assert [r["request_id"] for r in _rows(db)] == ["new"]


_V1_DDL = """
CREATE TABLE requests (
    id INTEGER PRIMARY KEY, request_id TEXT NOT NULL UNIQUE, ts REAL NOT NULL, face TEXT NOT NULL,
    profile TEXT, target_model TEXT, draft_model TEXT, route TEXT, cache TEXT,
    prompt_tokens INTEGER NOT NULL DEFAULT 0, completion_tokens INTEGER NOT NULL DEFAULT 0,
    ttft_ms REAL NOT NULL DEFAULT 0, decode_tps REAL NOT NULL DEFAULT 0, e2e_ms REAL,
    spec_mode TEXT NOT NULL DEFAULT 'off', drafted INTEGER NOT NULL DEFAULT 0,
    accepted INTEGER NOT NULL DEFAULT 0, finish_reason TEXT
);
PRAGMA user_version = 1;
"""


def test_a_version_1_database_is_migrated_keeping_its_rows(db):
    # A file as the first release wrote it, written by hand (not through our code).
    conn = sqlite3.connect(db)
    conn.executescript(_V1_DDL)
    conn.execute(
        "INSERT INTO requests (request_id, ts, face, target_model, prompt_tokens, completion_tokens, ttft_ms,"
        " decode_tps, e2e_ms, spec_mode, drafted, accepted, finish_reason)"
        " VALUES ('old-1', ?, 'api', 'm', 12, 40, 150, 25.0, 2000, 'draft', 30, 21, 'stop')", (time.time() - 60,),
    )
    conn.commit()
    conn.close()
    with Metrics(db) as m:
        m.record(RequestRecord.from_stats(_stats(), face="tui", request_id="new-1", error_class="RuntimeError"))
        m.feedback("old-1", 1, "thumbs")
        assert m.flush()
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    cols = {r[1] for r in conn.execute("PRAGMA table_info(requests)")}
    assert {"target_hash", "accepted_by_position", "compute_s", "error_class", "prompt_text"} <= cols
    conn.close()
    rows = {r["request_id"]: r for r in _rows(db)}
    old = rows["old-1"]
    assert (old["completion_tokens"], old["drafted"], old["accepted"]) == (40, 30, 21)
    assert old["compute_s"] == pytest.approx(2.0)  # back-filled from the wall time v1 kept
    assert old["accepted_by_position"] == "[]" and old["feedback_score"] == 1
    assert rows["new-1"]["error_class"] == "RuntimeError"


def _predicted_stats() -> Stats:
    """A reply asked with a 120-token prediction: 50 of its tokens drafted, 42 of them kept."""
    s = _stats(drafted=60, accepted=48)
    s.prediction_tokens, s.prediction_drafted, s.prediction_accepted = 120, 50, 42
    return s


def test_prediction_counts_round_trip_through_the_log(db):
    with Metrics(db) as m:
        m.record(RequestRecord.from_stats(_predicted_stats(), face="api", request_id="pred"))
        m.record(RequestRecord.from_stats(_stats(), face="api", request_id="plain"))
        assert m.flush()
    rows = {r["request_id"]: r for r in _rows(db)}
    got = [rows["pred"][f"prediction_{k}"] for k in ("tokens", "drafted", "accepted", "rejected")]
    assert got == [120, 50, 42, 8]
    assert [rows["plain"][f"prediction_{k}"] for k in ("tokens", "drafted", "accepted", "rejected")] == [0] * 4
    back = RequestRecord.from_row(rows["pred"])
    assert (back.prediction_drafted, back.prediction_accepted, back.prediction_rejected) == (50, 42, 8)


def test_a_version_2_database_gains_the_prediction_columns_keeping_its_rows(db):
    from localspec.metrics.store import MIGRATIONS, _statements

    conn = sqlite3.connect(db)  # a file as the release before Predicted Outputs left it: schema v2
    for script in MIGRATIONS[:2]:
        for statement in _statements(script):
            conn.execute(statement)
    conn.execute("PRAGMA user_version = 2")
    conn.execute("INSERT INTO requests (request_id, ts, face, completion_tokens, drafted, accepted)"
                 " VALUES ('v2-row', ?, 'api', 40, 30, 21)", (time.time() - 60,))
    conn.commit()
    conn.close()
    with Metrics(db) as m:
        m.record(RequestRecord.from_stats(_predicted_stats(), face="tui", request_id="v3-row"))
        assert m.flush()
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 3
    conn.close()
    rows = {r["request_id"]: r for r in _rows(db)}
    old = rows["v2-row"]
    assert (old["completion_tokens"], old["drafted"], old["accepted"]) == (40, 30, 21)
    assert [old[f"prediction_{k}"] for k in ("tokens", "drafted", "accepted", "rejected")] == [0] * 4
    assert RequestRecord.from_row(old).prediction_rejected == 0
    assert (rows["v3-row"]["prediction_accepted"], rows["v3-row"]["prediction_rejected"]) == (42, 8)


def test_processes_starting_together_share_one_fresh_database(db):
    import threading

    made: list[Metrics] = []
    errors: list[BaseException] = []

    def start(i: int) -> None:
        try:
            m = Metrics(db)
            m.record(RequestRecord(face="api", request_id=f"p{i}"))
            made.append(m)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for m in made:
        assert m.flush(timeout=60)
        m.close()
    assert not errors
    assert sorted(r["request_id"] for r in _rows(db)) == ["p0", "p1", "p2", "p3"]


def test_a_newer_schema_is_refused_with_a_fix(db):
    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    from localspec.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        Metrics(db)
    assert "Upgrade localspec" in (err.value.fix or "")


def test_a_corrupt_database_is_moved_aside_and_recreated(db, caplog):
    garbage = b"this is not an sqlite file at all " * 200
    db.write_bytes(garbage)
    with caplog.at_level(logging.WARNING, logger="localspec.metrics"):
        m = Metrics(db)
    try:
        aside = list(db.parent.glob("metrics.sqlite.corrupt-*"))
        assert len(aside) == 1 and aside[0].read_bytes() == garbage
        assert m.recovered_from == aside[0]
        assert any("moved it to" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
        m.record(RequestRecord.from_stats(_stats(), face="api", request_id="after"))
        assert m.flush()
    finally:
        m.close()
    assert [r["request_id"] for r in _rows(db)] == ["after"]


def _sqlite_with(path: Path, script: str, version: int = 0) -> None:
    conn = sqlite3.connect(path)
    conn.executescript(script)
    conn.execute(f"PRAGMA user_version = {version}")
    conn.commit()
    conn.close()


@pytest.mark.parametrize("what", ["folder", "text", "other_app", "tables_missing", "empty_sqlite"])
def test_a_report_never_moves_or_creates_what_db_names(tmp_path, capsys, what):
    """`stats --db` opened the path as the writer does: whatever it could not read was renamed
    `.corrupt-<time>` and a new database put in its place, exit 0 (a folder of code, a text file,
    /dev/null as root). A report only reads: anything but a metrics database is refused in one line."""
    path = tmp_path / "named"
    if what == "folder":
        (path / "src").mkdir(parents=True)
        (path / "src" / "main.py").write_text("precious")
    elif what == "text":
        path.write_text("notes\n" * 100)
    elif what == "other_app":
        _sqlite_with(path, "CREATE TABLE requests (url TEXT); CREATE TABLE other (x);")
    elif what == "tables_missing":  # at today's version, without the tables (was a traceback)
        _sqlite_with(path, "CREATE TABLE unrelated (x);", version=SCHEMA_VERSION)
    else:
        _sqlite_with(path, "")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    contents = path.read_bytes() if path.is_file() else None
    assert main(["stats", "--db", str(path)]) == 1
    err = capsys.readouterr().err
    assert str(path) in err and "Point --db at a localspec metrics.sqlite" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) <= 2  # the cause, and the fix
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert (path.read_bytes() if path.is_file() else None) == contents


@pytest.mark.parametrize("args", [[], ["--by", "model"], ["--by", "face"], ["--by", "day"], ["--drift"], ["--json"]])
def test_rows_another_writer_left_with_values_of_the_wrong_type_are_left_out_and_said(db, capsys, caplog, args):
    """SQLite keeps whatever a hand edit or another tool writes: text in a numeric column made every
    report a traceback (int + str)."""
    with Metrics(db) as m:
        for i in range(3):
            m.record(RequestRecord(face="cli", request_id=f"r{i}", completion_tokens=10, decode_tps=20.0,
                                   target_model="[bold]t[/]"))
        assert m.flush()
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE requests SET decode_tps = 'fast', completion_tokens = 'many' WHERE request_id = 'r1'")
        conn.execute("UPDATE requests SET drafted_by_position = 'not json' WHERE request_id = 'r2'")
    conn.close()
    before = db.read_bytes()
    assert main(["stats", "--db", str(db), *args]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    [line] = [r.getMessage() for r in caplog.records if "wrong type" in r.getMessage()]  # once, --drift too
    assert "2 of 3 requests" in line and "column 'completion_tokens' = 'many'" in line and "left out" in line
    assert "Fix:" in line and "\n" not in line
    if "--json" in args:
        assert json.loads(out)["groups"][0]["requests"] == 1
    assert db.read_bytes() == before


def test_names_in_the_log_reach_the_terminal_without_their_escape_sequences(db, capsys):
    """A model id or profile is any text another writer left: "\x1b[2J" cleared the screen of `stats`."""
    with Metrics(db) as m:
        m.record(RequestRecord(face="cli", target_model="[bold]t[/]\x1b[2J\x1b]0;title\x07", completion_tokens=1))
        assert m.flush()
    assert main(["stats", "--db", str(db), "--by", "model"]) == 0
    out = capsys.readouterr().out
    assert "[bold]t[/]" in out and "\x1b" not in out and "\x07" not in out


def test_a_broken_default_database_gets_a_fix_that_applies_without_db(capsys):
    """The fix read "leave --db out for the one in the data dir" to a user who had left it out."""
    from localspec.metrics import default_db_path

    path = default_db_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"not a database" * 100)
    assert main(["stats"]) == 1
    err = capsys.readouterr().err
    assert "is not a readable SQLite database" in err and "leave --db out" not in err
    assert f"Move {path} aside" in err and len(err.strip().splitlines()) == 2
    assert path.read_bytes() == b"not a database" * 100


def test_a_report_reads_and_migrates_a_metrics_database_it_is_pointed_at(db):
    """A version-1 file (no feedback table yet) was refused as "not localspec's metrics"."""
    from localspec.metrics.store import MIGRATIONS

    _sqlite_with(db, MIGRATIONS[0] + "INSERT INTO requests (request_id, ts, face) VALUES ('one', 1.0, 'api');", version=1)
    conn = open_reader(db)
    try:
        assert [r["request_id"] for r in fetch_rows(conn)] == ["one"]
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        conn.close()


def test_an_older_database_that_cannot_be_written_is_one_line(db, capsys, monkeypatch):
    """Migrating writes: a read-only older file gave sqlite's own error. (Root writes read-only files, so
    the refusal is sqlite's, as a read-only file or folder gives it.)"""
    import sqlite3 as sq

    from localspec.metrics import store
    from localspec.metrics.store import MIGRATIONS

    def read_only(conn, path):
        raise sq.OperationalError("attempt to write a readonly database")

    _sqlite_with(db, MIGRATIONS[0], version=1)
    monkeypatch.setattr(store, "_migrate", read_only)
    assert main(["stats", "--db", str(db)]) == 1
    err = capsys.readouterr().err
    assert "schema v1 and could not be brought up to date (attempt to write a readonly database)" in err
    assert "Traceback" not in err and "Make it writable" in err


def test_record_does_not_wait_for_a_locked_database_and_writes_after_release(db):
    Metrics(db).close()  # an existing log, as a restarted server finds it
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another process holding the write lock
    m = Metrics(db)  # starting up needs no write lock on a current schema
    try:
        for i in range(50):
            m.record(RequestRecord.from_stats(_stats(), face="api", request_id=f"locked-{i}"))
        # Every record() call came back while the lock is still held, and nothing could be written.
        assert not m.flush(timeout=0.5)
        assert blocker.execute("SELECT count(*) FROM requests").fetchone()[0] == 0
        blocker.execute("COMMIT")
        assert m.flush(timeout=60)
    finally:
        blocker.close()
        m.close()
    assert len(_rows(db)) == 50


def test_prometheus_text_parses_with_the_expected_families(db):
    with Metrics(db) as m:
        m.record(RequestRecord.from_stats(_stats(drafted=8, accepted=5), face="api", finish_reason="stop",
                                          e2e_ms=700.0, cache="miss", route="target"))
        m.record(RequestRecord.from_stats(_stats(mode="off", drafted=0, accepted=0), face="tui",
                                          finish_reason="error", error_class="RuntimeError", e2e_ms=50.0,
                                          cache="hit"))
        m.observe_inter_token(0.03)
        m.observe_inter_token(0.2)
        m.set_queue_depth(3)
        text = generate_latest(m.registry).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert all(name.startswith("localspec_") and ":" not in name for name in fams)

    def value(family: str, sample: str, **labels: str) -> float:
        for s in fams[family].samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
        raise AssertionError(f"no {sample} {labels} in\n{text}")

    assert fams["localspec_requests"].type == "counter"
    assert value("localspec_requests", "localspec_requests_total", face="api", mode="draft", finish_reason="stop") == 1
    assert value("localspec_request_errors", "localspec_request_errors_total", error_class="RuntimeError") == 1
    assert value("localspec_prompt_tokens", "localspec_prompt_tokens_total", face="api") == 30
    assert value("localspec_completion_tokens", "localspec_completion_tokens_total", face="tui") == 11
    assert value("localspec_cache_lookups", "localspec_cache_lookups_total", result="hit") == 1
    assert value("localspec_spec_drafts", "localspec_spec_drafts_total", mode="draft") == 2
    assert value("localspec_spec_drafted_tokens", "localspec_spec_drafted_tokens_total", mode="draft") == 8
    assert value("localspec_spec_accepted_tokens", "localspec_spec_accepted_tokens_total", mode="draft") == 5
    assert value("localspec_spec_accepted_by_position", "localspec_spec_accepted_by_position_total", position="1") == 2
    assert value("localspec_spec_accepted_by_position", "localspec_spec_accepted_by_position_total", position="3") == 1
    assert fams["localspec_time_to_first_token_seconds"].type == "histogram"
    assert value("localspec_request_duration_seconds", "localspec_request_duration_seconds_count") == 2
    assert value("localspec_inter_token_latency_seconds", "localspec_inter_token_latency_seconds_count") == 2
    assert value("localspec_inter_token_latency_seconds", "localspec_inter_token_latency_seconds_bucket",
                 le="0.05") == 1
    assert value("localspec_queue_depth", "localspec_queue_depth") == 3
    assert "localspec_prediction_tokens" not in fams or not fams["localspec_prediction_tokens"].samples


def test_prometheus_counts_prediction_tokens_by_outcome(db):
    with Metrics(db) as m:
        for _ in range(2):
            m.record(RequestRecord.from_stats(_predicted_stats(), face="api", finish_reason="stop"))
        m.record(RequestRecord.from_stats(_stats(drafted=8, accepted=5), face="api", finish_reason="stop"))
        text = generate_latest(m.registry).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) if f.name == "localspec_prediction_tokens"
               for s in f.samples}
    total = "localspec_prediction_tokens_total"
    assert samples[(total, (("outcome", "accepted"),))] == 2 * 42
    assert samples[(total, (("outcome", "rejected"),))] == 2 * 8


def test_two_instances_keep_separate_registries(tmp_path):
    with Metrics(tmp_path / "a.sqlite") as a, Metrics(tmp_path / "b.sqlite") as b:
        a.record(RequestRecord.from_stats(_stats(), face="api", finish_reason="stop"))
        assert "localspec_requests_total" in generate_latest(a.registry).decode()
        fams = {f.name: f for f in text_string_to_metric_families(generate_latest(b.registry).decode())}
        assert not fams["localspec_requests"].samples


def test_spend_from_settings(tmp_path, isolated_home):
    settings_file = isolated_home / "config" / "settings.toml"
    settings_file.parent.mkdir(parents=True, exist_ok=True)
    settings_file.write_text(
        "[engine]\nn_ctx = 2048\n\n[metrics]\ncost_per_hour = 3.6\nreference_price_per_mtok = 2.0\n"
        "reference_output_price_per_mtok = 10.0\nretention_days = 30\n\n[metrics.drift]\nacceptance_rate = 0.2\n"
    )
    s = load_metrics_settings()
    assert (s.cost_per_hour, s.retention_days, s.drift.acceptance_rate) == (3.6, 30, 0.2)
    rows = [{"compute_s": 100.0, "prompt_tokens": 1_000_000, "completion_tokens": 500_000}]
    sp = spend(rows, s)
    assert sp.local_cost == pytest.approx(0.1)  # 100 s at 3.6/h
    assert sp.api_cost == pytest.approx(2.0 + 5.0)
    assert sp.savings == pytest.approx(6.9)
    assert spend(rows, MetricsSettings()).local_cost is None


def test_bad_metrics_settings_are_a_config_error(isolated_home):
    from localspec.errors import ConfigError

    f = isolated_home / "config" / "settings.toml"
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text("[metrics]\ncost_per_hour = -1\n")
    with pytest.raises(ConfigError, match="cost_per_hour"):
        load_metrics_settings()


# ---------------------------------------------------------------- drift


def _history(now: float, shifted: bool, n: int = 60) -> list[RequestRecord]:
    """n requests a day over 8 days; with `shifted`, the last day has lower acceptance and speed."""
    out = []
    for day in range(8):
        recent = day == 7
        for i in range(n):
            ts = now - (8 - day) * DAY + (i + 0.5) * DAY / n
            accepted = 3 if (shifted and recent) else 6
            tps = (12.0 if (shifted and recent) else 20.0) + (i % 5) * 0.2
            rec = RequestRecord.from_stats(_stats(drafted=8, accepted=accepted, tps=tps), face="api",
                                           finish_reason="stop", request_id=f"d{day}-{i}",
                                           cache="hit" if i % 4 == 0 else "miss",
                                           route="target" if i % 2 else "small")
            rec.ts = ts
            out.append(rec)
    return out


def _seed(db: Path, records: list[RequestRecord]) -> None:
    with Metrics(db) as m:
        for r in records:
            m.record(r)
        assert m.flush(timeout=60)


def test_drift_flags_a_known_shift_naming_metric_and_size(db):
    now = time.time()
    _seed(db, _history(now, shifted=True))
    flags = {f.metric: f for f in detect_drift(db, DriftLimits(), now=now)}
    assert set(flags) == {"acceptance_rate", "tokens_per_second"}
    acc = flags["acceptance_rate"]
    assert acc.baseline == pytest.approx(0.75) and acc.recent == pytest.approx(0.375)
    assert acc.change == pytest.approx(-0.375)
    assert "acceptance_rate fell" in acc.describe() and "-0.375" in acc.describe()
    assert flags["tokens_per_second"].change == pytest.approx(-0.4, abs=0.02)
    assert "%" in flags["tokens_per_second"].describe()


def test_no_drift_flag_without_a_shift(db):
    now = time.time()
    _seed(db, _history(now, shifted=False))
    assert detect_drift(db, DriftLimits(), now=now) == []
    assert active_drift_flags(db, now=now) == []


def test_drift_needs_enough_samples_and_covers_every_metric():
    def row(ts, **kw):
        base = {"ts": ts, "drafted": 10, "accepted": 8, "decode_tps": 20.0, "ttft_ms": 100.0,
                "cache": "hit" if ts % 2 else "miss",
                "cache_wrong": 0, "route": "target", "finish_reason": "stop", "error_class": None,
                "feedback_score": 1.0}
        base.update(kw)
        return base

    baseline = [row(i) for i in range(60)]
    recent = [row(i, ttft_ms=200.0, cache_wrong=1, finish_reason="error", feedback_score=-1.0, route="small")
              for i in range(60)]
    flagged = {c.metric for c in compare(baseline, recent, DriftLimits()) if c.flagged}
    assert flagged == {"ttft_ms", "cache_false_hit_rate", "error_rate", "feedback_score", "route_share[small]",
                       "route_share[target]"}
    few = {c.metric for c in compare(baseline, recent[:5], DriftLimits()) if c.flagged}
    assert few == set()


def test_summary_aggregates(db):
    now = time.time()
    _seed(db, _history(now, shifted=False, n=10))
    s = summarize(_rows(db), MetricsSettings())
    assert s.requests == 80 and s.errors == 0
    assert s.acceptance_rate == pytest.approx(0.75)
    assert s.cache_hit_rate == pytest.approx(3 / 10)
    assert s.mean_accepted_length == pytest.approx(10 / 4)


# ---------------------------------------------------------------- localspec stats


def test_stats_drift_flags_a_seeded_shift(db, capsys):
    _seed(db, _history(time.time(), shifted=True))
    assert main(["stats", "--db", str(db), "--drift", "--since", "9d"]) == 0
    out = capsys.readouterr().out
    assert "480" in out  # requests in the summary table
    assert "DRIFT acceptance_rate fell 0.75 → 0.375" in out
    assert "DRIFT tokens_per_second fell" in out
    assert "cache_hit_rate" in out and "DRIFT cache_hit_rate" not in out
    assert "route_share[target]" in out and "route_share[small]" in out


def test_stats_drift_quiet_without_a_shift(db, capsys):
    _seed(db, _history(time.time(), shifted=False))
    assert main(["stats", "--db", str(db), "--drift"]) == 0
    out = capsys.readouterr().out
    assert "no drift beyond the limits" in out and "DRIFT " not in out


def test_stats_by_group_plot_and_export(db, tmp_path, capsys):
    now = time.time()
    recs = _history(now, shifted=False, n=6)
    for r in recs[:10]:
        r.spec_mode = "lookup"
    _seed(db, recs)
    assert main(["stats", "--db", str(db), "--since", "30d", "--by", "mode"]) == 0
    out = capsys.readouterr().out
    assert "lookup" in out and "draft" in out and "38" in out  # 48 requests, 10 lookup, 38 draft

    assert main(["stats", "--db", str(db), "--since", "30d", "--by", "day"]) == 0
    assert len([ln for ln in capsys.readouterr().out.splitlines() if "│" in ln and "-" in ln.split("│")[1]]) >= 8

    assert main(["stats", "--db", str(db), "--since", "30d", "--plot"]) == 0
    out = capsys.readouterr().out
    assert "acceptance rate, per day" in out and "cache hit rate" in out and "•" in out

    assert main(["stats", "--db", str(db), "--since", "2d", "--export", "json"]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert len(exported) == 12 and exported[0]["face"] == "api"

    csv_path = tmp_path / "out.csv"
    assert main(["stats", "--db", str(db), "--since", "30d", "--export", "csv", "-o", str(csv_path)]) == 0
    lines = csv_path.read_text().splitlines()
    assert lines[0].startswith("id,request_id,ts,face") and len(lines) == 49


@pytest.mark.parametrize("out", ["", "missing/out.csv"])  # the directory itself; a folder that does not exist
def test_stats_export_to_a_path_it_cannot_write_is_one_line(db, tmp_path, capsys, out):
    _seed(db, _history(time.time(), shifted=False, n=1))
    path = tmp_path / out
    assert main(["stats", "--db", str(db), "--since", "30d", "--export", "csv", "-o", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: Cannot write {path} (--out): ") and len(err.splitlines()) == 2


@pytest.mark.parametrize("since", ["99999999d", "9" * 400 + "w"])
def test_stats_since_before_any_date_is_a_usage_error(db, capsys, since):
    _seed(db, _history(time.time(), shifted=False, n=1))
    assert main(["stats", "--db", str(db), "--since", since]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: The period {since!r} reaches back before any date.") and "fix: " in err


def test_stats_shows_local_cost_and_savings_when_prices_are_set(db, isolated_home, capsys):
    settings_file = isolated_home / "config" / "settings.toml"
    settings_file.parent.mkdir(parents=True, exist_ok=True)
    settings_file.write_text("[metrics]\ncost_per_hour = 36.0\nreference_price_per_mtok = 1000.0\n")
    _seed(db, _history(time.time(), shifted=False, n=1))  # 8 requests, 0.59 s and 41 tokens each
    assert main(["stats", "--db", str(db), "--since", "30d"]) == 0
    out = capsys.readouterr().out
    assert "local cost" in out and "API cost" in out and "saved" in out
    assert "0.0472" in out and "0.3280" in out and "0.2808" in out


def test_stats_on_an_empty_home_says_so(capsys):
    assert main(["stats"]) == 0
    assert "No requests logged yet" in capsys.readouterr().out


def test_stats_rejects_an_unreadable_period(db, capsys):
    _seed(db, _history(time.time(), shifted=False, n=1))
    assert main(["stats", "--db", str(db), "--since", "last tuesday"]) == 2
    assert "Cannot read the period" in capsys.readouterr().err
