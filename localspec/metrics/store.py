"""The metrics database: SQLite in WAL mode, versioned with `PRAGMA user_version`.

Every change to the schema is a new entry in `MIGRATIONS`; a fresh file runs them all in order,
so the upgrade path is the path every install takes. A file SQLite cannot read is moved aside
(`metrics.sqlite.corrupt-<ts>`) and a new one created: losing history beats losing requests.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, get_type_hints

from localspec.errors import ConfigError
from localspec.metrics.record import COLUMNS, RequestRecord
from localspec.paths import resolve_paths

log = logging.getLogger(__name__)

DB_NAME = "metrics.sqlite"
BUSY_TIMEOUT_MS = 200  # short: the writer retries on its own, readers should not stall a face
SETUP_BUSY_TIMEOUT_MS = 10_000

# Version 1: the first schema (kept so old files upgrade through the same steps).
_V1 = """
CREATE TABLE requests (
    id INTEGER PRIMARY KEY,
    request_id TEXT NOT NULL UNIQUE,
    ts REAL NOT NULL,
    face TEXT NOT NULL,
    profile TEXT,
    target_model TEXT,
    draft_model TEXT,
    route TEXT,
    cache TEXT,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    ttft_ms REAL NOT NULL DEFAULT 0,
    decode_tps REAL NOT NULL DEFAULT 0,
    e2e_ms REAL,
    spec_mode TEXT NOT NULL DEFAULT 'off',
    drafted INTEGER NOT NULL DEFAULT 0,
    accepted INTEGER NOT NULL DEFAULT 0,
    finish_reason TEXT
);
"""

# Version 2: model hashes, route reason, cache similarity, per-position acceptance, spend,
# error class, opt-in prompt text, and feedback joined by request id.
_V2 = """
ALTER TABLE requests ADD COLUMN target_hash TEXT;
ALTER TABLE requests ADD COLUMN draft_hash TEXT;
ALTER TABLE requests ADD COLUMN route_reason TEXT;
ALTER TABLE requests ADD COLUMN cache_similarity REAL;
ALTER TABLE requests ADD COLUMN reused_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN prefill_ms REAL NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN decode_ms REAL NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN compute_s REAL NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN target_passes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN drafted_by_position TEXT NOT NULL DEFAULT '[]';
ALTER TABLE requests ADD COLUMN accepted_by_position TEXT NOT NULL DEFAULT '[]';
ALTER TABLE requests ADD COLUMN mean_accepted_length REAL NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN error_class TEXT;
ALTER TABLE requests ADD COLUMN prompt_text TEXT;
-- v1 rows knew only the wall time; it is the best estimate of their compute.
UPDATE requests SET compute_s = COALESCE(e2e_ms, 0) / 1000.0;
CREATE INDEX requests_ts ON requests (ts);
CREATE TABLE feedback (
    id INTEGER PRIMARY KEY,
    request_id TEXT NOT NULL,
    ts REAL NOT NULL,
    score INTEGER NOT NULL,
    kind TEXT NOT NULL
);
CREATE INDEX feedback_request ON feedback (request_id);
"""

# Version 3: Predicted Outputs (issue #26): the prediction's length and its drafted, accepted and
# rejected tokens. Older rows had no prediction, so 0 is their true value.
_V3 = """
ALTER TABLE requests ADD COLUMN prediction_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN prediction_drafted INTEGER NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN prediction_accepted INTEGER NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN prediction_rejected INTEGER NOT NULL DEFAULT 0;
"""

MIGRATIONS: tuple[str, ...] = (_V1, _V2, _V3)
SCHEMA_VERSION = len(MIGRATIONS)


def default_db_path() -> Path:
    return resolve_paths().data_dir / DB_NAME


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    return conn


def _statements(script: str) -> list[str]:
    lines = [ln for ln in script.splitlines() if not ln.lstrip().startswith("--")]
    return [st.strip() for st in "\n".join(lines).split(";") if st.strip()]


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    for target in range(1, SCHEMA_VERSION + 1):
        if conn.execute("PRAGMA user_version").fetchone()[0] >= target:
            continue
        # One transaction per step, re-checking the version under the write lock: another process
        # may have migrated meanwhile, and a failure leaves the file at the previous version.
        conn.execute("BEGIN IMMEDIATE")
        try:
            if conn.execute("PRAGMA user_version").fetchone()[0] < target:
                for statement in _statements(MIGRATIONS[target - 1]):
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {target}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        log.debug("metrics db %s at v%d", path, target)


def _check_version(conn: sqlite3.Connection, path: Path) -> None:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise ConfigError(
            f"{path} has metrics schema v{version}; this localspec knows up to v{SCHEMA_VERSION}.",
            "Upgrade localspec, or point it at another database with --db.",
        )


def _prepare(path: Path) -> sqlite3.Connection:
    conn = _connect(path)
    try:
        conn.execute(f"PRAGMA busy_timeout = {SETUP_BUSY_TIMEOUT_MS}")  # a peer may be creating the file
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            log.debug("metrics db %s: journal_mode is %s", path, mode)
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return _current(conn, path)
    except BaseException:
        conn.close()
        raise


def _current(conn: sqlite3.Connection, path: Path) -> sqlite3.Connection:
    """A readable file at today's schema: a newer one refused, an older one migrated (waiting on a peer)."""
    _check_version(conn, path)
    conn.execute(f"PRAGMA busy_timeout = {SETUP_BUSY_TIMEOUT_MS}")
    _migrate(conn, path)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    return conn


def _move_aside(path: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%S")
    dest = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while dest.exists():
        dest = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
        n += 1
    path.replace(dest)
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.replace(dest.with_name(dest.name + suffix))
    return dest


def open_db(path: Path) -> tuple[sqlite3.Connection, Path | None]:
    """Open (creating and migrating) the database; returns it and where a corrupt file went."""
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + SETUP_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            return _prepare(path), None
        except sqlite3.DatabaseError as exc:
            if not (isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)):
                broken = exc
                break
            # Busy, not broken. Switching to WAL while a peer creates the file can fail at once,
            # without SQLite calling the busy handler, so wait for the peer here.
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.02)
    dest = _move_aside(path)
    log.warning("metrics database %s is unreadable (%s); moved it to %s and started a new one", path, broken, dest)
    return _prepare(path), dest


_INSERT = f"INSERT OR REPLACE INTO requests ({', '.join(COLUMNS)}) VALUES ({', '.join(':' + c for c in COLUMNS)})"


def insert_records(conn: sqlite3.Connection, records: Iterable[RequestRecord]) -> None:
    conn.executemany(_INSERT, [r.to_row() for r in records])


def insert_feedback(conn: sqlite3.Connection, items: Iterable[tuple[str, float, int, str]]) -> None:
    conn.executemany("INSERT INTO feedback (request_id, ts, score, kind) VALUES (?, ?, ?, ?)", list(items))


def prune(conn: sqlite3.Connection, retention_days: float, now: float | None = None) -> int:
    """Delete requests (and their feedback) older than the retention period; returns rows removed."""
    cutoff = (now if now is not None else time.time()) - retention_days * 86400
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(
            "DELETE FROM feedback WHERE request_id IN (SELECT request_id FROM requests WHERE ts < ?)", (cutoff,)
        )
        n = conn.execute("DELETE FROM requests WHERE ts < ?", (cutoff,)).rowcount
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return n


def fetch_rows(
    conn: sqlite3.Connection, since: float | None = None, until: float | None = None
) -> list[dict[str, Any]]:
    """Requests in [since, until), oldest first, with their feedback folded in:
    `feedback_score` (mean score, None without feedback) and `cache_wrong` (0/1)."""
    sql = (
        "SELECT r.*, f.score AS feedback_score, COALESCE(f.cache_wrong, 0) AS cache_wrong FROM requests r "
        "LEFT JOIN (SELECT request_id, AVG(CASE WHEN kind != 'cache_wrong' THEN score END) AS score, "
        "MAX(kind = 'cache_wrong') AS cache_wrong FROM feedback GROUP BY request_id) f "
        "ON f.request_id = r.request_id WHERE r.ts >= ? AND r.ts < ? ORDER BY r.ts"
    )
    lo = since if since is not None else float("-inf")
    hi = until if until is not None else float("inf")
    rows = [dict(r) for r in conn.execute(sql, (lo, hi))]
    wrong = [(row, col) for row in rows if (col := _wrong_column(row))]
    if not wrong:
        return rows
    path = conn.execute("PRAGMA database_list").fetchone()[2]
    if path not in _SAID:  # once per file: `--drift` reads its windows again
        _SAID.add(path)
        row, col = wrong[0]
        log.warning("%d of %d requests in %s hold values of the wrong type (first: column '%s' = %.40r); they are "
                    "left out of the report. Fix: none needed, the file is left as it is (a hand edit or another "
                    "tool wrote them).", len(wrong), len(rows), path, col, row[col])
    bad = {id(row) for row, _ in wrong}
    return [row for row in rows if id(row) not in bad]


# What each column holds as this version writes it; SQLite keeps whatever another writer put there.
_KINDS = {name: ("positions" if name.endswith("_by_position") else "text" if hint in (str, str | None) else "number")
          for name, hint in get_type_hints(RequestRecord).items()}
_SAID: set[str] = set()


def _wrong_column(row: dict[str, Any]) -> str | None:
    """The first column whose value a report cannot use (None: the row is sound). NULL is every column's default."""
    for name, kind in _KINDS.items():
        value = row.get(name)
        if value is None:
            continue
        if kind == "text" and not isinstance(value, str):
            return name
        if kind == "number" and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return name
        if kind == "positions":
            try:
                parsed = json.loads(value) if value else []
            except (TypeError, ValueError):
                return name
            if not isinstance(parsed, list) or not all(isinstance(n, int) for n in parsed):
                return name
    return None


_TABLES = ("requests",)  # every version has it; `feedback` came with version 2, and migrating adds it


def open_reader(path: Path) -> sqlite3.Connection:
    """A connection for reports on a metrics database that exists; an older one is migrated so queries
    see today's columns. Never creates or moves anything: `stats --db` names any path, and opening it
    as the writer does (a file it cannot read is moved aside as corrupt) renamed a user's folder, a text
    file and /dev/null. Anything that is not a localspec metrics database is refused in one line."""
    fix = (f"Move {path} aside (the next request logged starts a new one), or point --db at another file."
           if path == default_db_path() else
           "Point --db at a localspec metrics.sqlite, or leave --db out for the one in the data dir.")
    if not path.is_file():
        raise ConfigError(f"{path} is not a file, so not a metrics database.", fix)
    conn = _connect(path)
    try:
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"{path} is not a readable SQLite database ({exc}).", fix) from None
        if tables and (version == 0 or not set(_TABLES) <= tables):
            missing = ", ".join(t for t in _TABLES if t not in tables)
            raise ConfigError(f"{path} is a SQLite database but not localspec's metrics"
                              f"{f' (it has no {missing} table)' if missing else ''}.", fix)
        if not tables:
            raise ConfigError(f"{path} is an empty SQLite database, not localspec's metrics.", fix)
        try:
            return _current(conn, path)
        except sqlite3.OperationalError as exc:  # an older file this user cannot write (migrating writes)
            raise ConfigError(f"{path} is at metrics schema v{version} and could not be brought up to date "
                              f"({exc}).", "Make it writable, or read it with the localspec that wrote it.") from None
    except BaseException:
        conn.close()
        raise
