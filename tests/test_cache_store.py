"""The cache without an embedder (exact-match mode): scope, store, eviction, TTL, bad input, no pickle."""

from __future__ import annotations

import errno
import json
import logging
import os
import pickle
import sqlite3
import time
from pathlib import Path

import pytest

from localspec.cache import SCHEMA_VERSION, CacheScope, SemanticCache
from localspec.cache.scope import PromptKind
from localspec.cache.store import JSONOnlyDisk
from localspec.engine.embedder import file_fingerprint
from tests.server_harness import wait_until


def scope(**kw) -> CacheScope:
    args = {"model_hash": "model-a", "system_prompt": "You are helpful.", "earlier_turns": [],
            "sampling": {"temperature": 0.0, "max_tokens": 64}}
    args.update(kw)
    return CacheScope.from_request(**args)


@pytest.fixture
def cache(tmp_path: Path):
    c = SemanticCache(tmp_path / "semantic")
    yield c
    c.close()


def test_exact_mode_says_so_and_hits_normalised_prompt(cache: SemanticCache) -> None:
    assert cache.mode == "exact"
    assert "exact-match" in cache.describe()
    cache.store(scope(), "How do I reverse a list?", "use reversed()", [1, 2, 3], {"completion_tokens": 3})
    hit = cache.lookup(scope(), "  how do I   reverse a list ")
    assert hit is not None and hit.kind == "exact" and hit.answer == "use reversed()"
    assert hit.token_ids == [1, 2, 3] and hit.stats == {"completion_tokens": 3}
    assert hit.matched_prompt == "How do I reverse a list?"
    assert cache.lookup(scope(), "What's the way to reverse a list?") is None  # no embedder: exact only
    stats = cache.stats()
    assert stats["exact_hits"] == 1 and stats["misses"] == 1 and stats["entries"] == 1


@pytest.mark.parametrize(("stored", "asked"), [
    ("Repeat this exactly: foo", "Repeat this exactly: FOO"),  # was answered "foo"
    ("Is x == X in Python?", "Is x == x in Python?"),
    ("Fix this:\nclass Foo:\n    def bar(self):\n        pass", "Fix this:\nclass Foo:\n  def bar(self):\n    pass"),
])
def test_case_and_indentation_that_change_the_answer_are_another_prompt(cache: SemanticCache, stored, asked) -> None:
    cache.store(scope(), stored, "the answer to the first")
    assert cache.lookup(scope(), asked) is None
    assert cache.lookup(scope(), stored) is not None


def test_a_raw_completion_prompt_is_matched_only_as_it_is(cache: SemanticCache) -> None:
    raw = CacheScope.from_request(model_hash="m", kind=PromptKind.COMPLETION)
    cache.store(raw, "def add(a, b):\n    ", "return a + b")
    assert cache.lookup(raw, "def add(a, b):\n    ") is not None
    for other in ("def add(a, b):\n", "def add(a, b):\n    return", "DEF ADD(A, B):\n    "):
        assert cache.lookup(raw, other) is None, other  # each is continued otherwise


@pytest.mark.parametrize("other", [
    {"system_prompt": "You are a pirate."},
    {"earlier_turns": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
    {"sampling": {"temperature": 0.0, "max_tokens": 512}},
    {"model_hash": "model-b"},
    {"has_tools": True},
    {"has_response_format": True},
])
def test_scope_separates_requests(cache: SemanticCache, other: dict) -> None:
    cache.store(scope(), "What is a closure?", "a function with its environment", [])
    assert cache.lookup(scope(**other), "What is a closure?") is None
    assert cache.lookup(scope(), "What is a closure?") is not None


def test_mark_wrong_evicts_and_counts(cache: SemanticCache) -> None:
    cache.store(scope(), "What is 2+2?", "5", [])
    hit = cache.lookup(scope(), "What is 2+2?")
    assert hit is not None
    assert cache.mark_wrong(hit.entry_id)
    assert cache.lookup(scope(), "What is 2+2?") is None
    assert cache.stats()["false_hits"] == 1


def test_stats_persist_across_processes(tmp_path: Path) -> None:
    with SemanticCache(tmp_path / "c") as c:
        c.store(scope(), "q", "a", [])
        c.lookup(scope(), "q")
    with SemanticCache(tmp_path / "c") as c:
        s = c.stats()
    assert s["stores"] == 1 and s["exact_hits"] == 1 and s["entries"] == 1


def test_ttl_expires_entries(tmp_path: Path) -> None:
    with SemanticCache(tmp_path / "c", ttl_s=0.5) as c:
        c.store(scope(), "short-lived question", "answer", [])
        stored_at = time.monotonic()
        assert c.lookup(scope(), "short-lived question") is not None
        # Poll for the expiry rather than sleeping a fixed time; it must not come before the TTL.
        assert wait_until(lambda: c.lookup(scope(), "short-lived question") is None, timeout=30), "never expired"
        assert time.monotonic() - stored_at >= 0.45


def test_size_limit_evicts_least_recently_used(tmp_path: Path) -> None:
    big = "x" * 40_000  # stored as a file, so every entry counts against the limit
    with SemanticCache(tmp_path / "c", size_limit=600_000) as c:
        c.store(scope(), "question 0", big, [])
        for i in range(1, 40):
            c.store(scope(), f"question {i}", big, [])
            assert c.lookup(scope(), "question 0") is not None  # kept hot
        assert c.lookup(scope(), "question 1") is None  # cold and old: evicted
        assert c.lookup(scope(), "question 39") is not None
        assert c.stats()["entries"] < 40


def test_model_change_invalidates_entries(tmp_path: Path) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 4096)
    old_hash = file_fingerprint(model)
    with SemanticCache(tmp_path / "c") as c:
        c.store(scope(model_hash=old_hash), "Explain recursion", "old model's answer", [])
        model.write_bytes(b"GGUF" + b"\1" * 4096)  # the file changed: a new fingerprint, a new scope
        new_hash = file_fingerprint(model)
        assert new_hash != old_hash
        assert c.lookup(scope(model_hash=new_hash), "Explain recursion") is None
        assert c.invalidate_model(new_hash) == 1
        assert c.stats()["entries"] == 0


@pytest.mark.parametrize("size", [(1 << 20) + 300_000, 2 << 20])
def test_a_small_file_is_fingerprinted_whole(tmp_path: Path, size: int) -> None:
    """An adapter between 1 and 2 MiB retrained past its first MiB is another file, with other answers."""
    adapter = tmp_path / "adapter.gguf"
    data = bytearray(b"GGUF" + b"\0" * (size - 4))
    adapter.write_bytes(data)
    before = file_fingerprint(adapter)
    data[(1 << 20) + 100_000] = 1
    adapter.write_bytes(data)
    assert file_fingerprint(adapter) != before


def test_schema_version_change_clears_store(tmp_path: Path) -> None:
    d = tmp_path / "c"
    with SemanticCache(d) as c:
        c.store(scope(), "q", "a", [])
    (d / "meta.json").write_text(json.dumps({"schema": SCHEMA_VERSION - 1}))
    with SemanticCache(d) as c:
        assert c.lookup(scope(), "q") is None
        assert c.stats()["entries"] == 0


def test_corrupt_database_is_rebuilt_with_warning(tmp_path: Path, caplog) -> None:
    d = tmp_path / "c"
    with SemanticCache(d) as c:
        c.store(scope(), "q", "a", [])
    (d / "entries" / "cache.db").write_bytes(b"this is not a sqlite database" * 100)
    for extra in ("cache.db-wal", "cache.db-shm"):
        (d / "entries" / extra).unlink(missing_ok=True)
    with caplog.at_level(logging.WARNING, logger="localspec.cache"), SemanticCache(d) as c:
        assert c.mode == "exact"
        assert c.lookup(scope(), "q") is None
        c.store(scope(), "q", "a2", [])
        assert c.lookup(scope(), "q").answer == "a2"
    assert any("rebuilding" in r.message for r in caplog.records)


def test_unusable_directory_disables_cache_without_failing(tmp_path: Path, caplog) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should be")
    with caplog.at_level(logging.WARNING, logger="localspec.cache"):
        c = SemanticCache(blocker / "semantic")
    assert c.mode == "off" and "cannot be used" in c.describe()
    c.store(scope(), "q", "a", [])  # never raises
    assert c.lookup(scope(), "q") is None
    c.close()


def test_full_disk_skips_caching_with_warning(cache: SemanticCache, monkeypatch, caplog) -> None:
    def enospc(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(cache._store._dc, "set", enospc)  # the write diskcache would do
    with caplog.at_level(logging.WARNING, logger="localspec.cache"):
        cache.store(scope(), "q", "a", [])
    assert cache.lookup(scope(), "q") is None
    assert cache.stats()["store_skipped"] == 1
    assert any("disk full" in r.message for r in caplog.records)


def test_entries_are_json_never_pickle(cache: SemanticCache) -> None:
    assert isinstance(cache._store.disk, JSONOnlyDisk)
    cache.store(scope(), "q", "answer text", [5, 6], {"nested": {"ok": True}})
    cache.store(scope(), "big", "y" * 100_000, [])  # large values go to files: JSON there too
    cache.close()
    con = sqlite3.connect(cache.directory / "entries" / "cache.db")
    rows = con.execute("SELECT key, raw, mode, filename, value FROM Cache").fetchall()
    con.close()
    assert rows
    for key, raw, mode, filename, value in rows:
        assert raw == 1 and isinstance(key, str)  # string keys stored as-is, never pickled
        assert mode != 4  # diskcache's MODE_PICKLE
        blob = (cache.directory / "entries" / filename).read_bytes() if filename else bytes(value)
        assert not blob.startswith(b"\x80")  # no pickle protocol header
        entry = json.loads(blob)
        assert entry["prompt"] in ("q", "big")


class _Boom:
    def __reduce__(self):
        return (Path.touch, (Path(os.environ["LOCALSPEC_HOME"]) / "pwned",))


def test_a_pickled_row_is_refused_not_loaded(cache: SemanticCache) -> None:
    from localspec.cache.semantic import entry_id_for

    cache.store(scope(), "q", "a", [])
    cache.close()
    db = cache.directory / "entries" / "cache.db"
    con = sqlite3.connect(db)
    key = "e:" + entry_id_for(scope(), "q")
    con.execute("UPDATE Cache SET mode = 4, value = ? WHERE key = ?", (sqlite3.Binary(pickle.dumps(_Boom())), key))
    con.commit()
    con.close()
    with SemanticCache(cache.directory) as c:
        assert c.lookup(scope(), "q") is None  # refused with a warning, never unpickled
    assert not (Path(os.environ["LOCALSPEC_HOME"]) / "pwned").exists()


def test_export_and_clear(cache: SemanticCache, tmp_path: Path) -> None:
    cache.store(scope(), "q1", "a1", [1])
    cache.store(scope(), "q2", "a2", [2])
    out = tmp_path / "export.jsonl"
    assert cache.export(out) == 2
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["prompt"] for r in rows} == {"q1", "q2"}
    assert cache.clear() == 2
    assert cache.lookup(scope(), "q1") is None


def test_a_raw_completion_prompt_is_never_embedded_not_even_when_the_index_is_rebuilt(tmp_path: Path) -> None:
    """Completions are left out of the vector index when stored; rebuilding the index from the entries
    (a lost or stale index) embedded them anyway."""
    from tests.fake_tier import ScriptedEmbedder

    chat, raw = scope(), CacheScope.from_request(model_hash="m", kind=PromptKind.COMPLETION)
    c = SemanticCache(tmp_path / "semantic", embedder=ScriptedEmbedder())
    c.store(raw, "def add(a, b):\n    ", "return a + b")
    c.store(chat, "How do I reverse a list?", "use reversed()")
    c.close()
    for index_file in (tmp_path / "semantic").glob("index*"):
        index_file.unlink()
    c = SemanticCache(tmp_path / "semantic", embedder=ScriptedEmbedder())
    try:
        assert c.lookup(raw, "def add(a, b):\n    ") is not None
        assert c._index is not None and len(c._index) == 1
    finally:
        c.close()


def _stored_but_not_indexed(directory: Path, prompts: list[str]) -> None:
    """Entries in the store that the saved vector index lacks (another face stored them and has not
    saved its index yet): the next cache to open embeds them and saves the index."""
    from tests.fake_tier import ScriptedEmbedder

    c = SemanticCache(directory, embedder=ScriptedEmbedder())
    c.store(scope(), "How do I reverse a list?", "use reversed()")
    c.close()  # the index holds this one
    c = SemanticCache(directory, embedder=ScriptedEmbedder())
    for p in prompts:
        c.store(scope(), p, "an answer")
    c._unsaved = 0  # as a face still running: its index is not saved yet
    c._close_store()


def test_two_faces_saving_the_index_at_once_keep_the_cache(tmp_path: Path, monkeypatch, caplog) -> None:
    """serve, chat and generate share one cache directory. Two saving its index at once used the same
    temporary file: one's rename took the other's, the other's rename failed, and a failure while
    opening reset the whole directory, every entry with it."""
    import numpy as np

    from localspec.cache import index as index_module
    from tests.fake_tier import ScriptedEmbedder

    d = tmp_path / "semantic"
    _stored_but_not_indexed(d, ["What is a tuple?", "How do I sort a dict by value?"])
    other = SemanticCache(d, embedder=ScriptedEmbedder())  # another face, with its own copy of the index
    other.store(scope(), "What does zip do?", "pairs items")
    real_save = np.save
    interleaved = []

    def save_while_the_other_saves(fh, matrix, **kw):
        if not interleaved:  # the other face saves between this one's write and its rename
            interleaved.append(True)
            other.close()
        real_save(fh, matrix, **kw)

    monkeypatch.setattr(index_module.np, "save", save_while_the_other_saves)
    with caplog.at_level(logging.WARNING, logger="localspec.cache"):
        c = SemanticCache(d, embedder=ScriptedEmbedder())  # embeds the two it lacks and saves the index
    monkeypatch.undo()
    try:
        assert interleaved and c.mode == "semantic", caplog.text
        assert "rebuilding it empty" not in caplog.text
        assert c.stats()["entries"] == 4
        assert c.lookup(scope(), "What is a tuple?") is not None
    finally:
        c.close()
    assert not [p.name for p in d.iterdir() if p.name.endswith(".tmp")]


def test_an_index_file_from_another_save_is_not_paired_with_this_ones(tmp_path: Path) -> None:
    """vectors.npy and vectors.json are renamed one after the other: two saves at once can leave one's
    matrix beside the other's ids. With as many rows in each, every vector then stood for another
    entry; the ids now name their matrix, and such a pair is rebuilt from the entries."""
    from localspec.cache.index import VectorIndex
    from tests.fake_tier import ScriptedEmbedder

    emb = ScriptedEmbedder()
    saves = {}
    for name, prompts in {"one": ["alpha", "beta"], "two": ["gamma", "delta"]}.items():
        idx = VectorIndex(emb.dim, emb.fingerprint)
        for p in prompts:
            vec = emb.embed(p)
            assert vec is not None
            idx.add(p, "scope", vec)
        saves[name] = tmp_path / name
        saves[name].mkdir()
        idx.save(saves[name])
    torn = tmp_path / "torn"
    torn.mkdir()
    (torn / "vectors.npy").write_bytes((saves["one"] / "vectors.npy").read_bytes())
    (torn / "vectors.json").write_bytes((saves["two"] / "vectors.json").read_bytes())
    with pytest.raises(ValueError, match="disagree"):
        VectorIndex.load(torn, emb.dim, emb.fingerprint)
    assert len(VectorIndex.load(saves["two"], emb.dim, emb.fingerprint)) == 2


def test_a_full_disk_while_the_index_is_rebuilt_keeps_the_entries(tmp_path: Path, monkeypatch, caplog) -> None:
    """Saving the index after embedding the entries it lacked is an optimisation: a full disk there
    reset the whole cache directory (every entry) as if it were corrupt."""
    from localspec.cache import index as index_module
    from tests.fake_tier import ScriptedEmbedder

    d = tmp_path / "semantic"
    _stored_but_not_indexed(d, ["What is a tuple?"])

    def full(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(index_module.np, "save", full)
    with caplog.at_level(logging.WARNING, logger="localspec.cache"):
        c = SemanticCache(d, embedder=ScriptedEmbedder())
    try:
        assert c.mode == "semantic" and "rebuilding it empty" not in caplog.text
        assert "index not saved" in caplog.text
        assert c.stats()["entries"] == 2 and c.lookup(scope(), "What is a tuple?") is not None
        monkeypatch.undo()
    finally:
        c.close()
    assert _saved_index_rows(d) == 2


def _saved_index_rows(d: Path) -> int:
    from localspec.cache.index import VectorIndex
    from tests.fake_tier import ScriptedEmbedder

    emb = ScriptedEmbedder()
    return len(VectorIndex.load(d, emb.dim, emb.fingerprint))


def test_a_verdict_key_left_empty_is_never_used(tmp_path: Path) -> None:
    """The key file was created first and written after: a face starting in between (or every face,
    once a full disk or a kill left it empty) signed verdict tokens with an empty key, which anyone
    can compute. A short key is replaced, and every face then signs with the one on disk."""
    import hashlib
    import hmac

    d = tmp_path / "semantic"
    d.mkdir()
    (d / "verdict.key").write_bytes(b"")
    first, second = SemanticCache(d), SemanticCache(d)
    try:
        token = first.verdict_token("entry", "alice")
        forged = hmac.new(b"", b"alice\nentry", hashlib.sha256).hexdigest()[:32]
        assert token != forged
        assert len((d / "verdict.key").read_bytes()) == 32
        assert second.verdict_token("entry", "alice") == token
    finally:
        first.close()
        second.close()
    assert not [p.name for p in d.iterdir() if p.name.endswith(".tmp")]


def test_the_vector_index_keeps_no_rows_for_entries_the_store_evicted(tmp_path: Path) -> None:
    """diskcache evicts past its size limit (and expires past the TTL) without telling the index, which
    kept a row for every entry ever stored: in memory and in vectors.npy, across restarts, so a
    long-running server's index grew for good while the store stayed at its limit (scripts/soak.py)."""
    from tests.fake_tier import ScriptedEmbedder

    d = tmp_path / "semantic"
    stored = 0
    for run in range(3):  # three processes in turn, each reading the index the last one saved
        with SemanticCache(d, embedder=ScriptedEmbedder(), size_limit=200_000) as c:
            for i in range(150):
                c.store(scope(), f"run {run} question {i} " + "x" * 50, "answer " * 100)
                stored += 1
            entries = c.stats()["entries"]
            assert entries < stored  # the store evicted: the case at hand
            assert c._index is not None and c._index._n <= 2 * entries + 2 * 64  # rows in memory: live, and dead ones short of a rebuild
        saved = json.loads((d / "vectors.json").read_text())["ids"]
        with SemanticCache(d, embedder=ScriptedEmbedder(), size_limit=200_000) as c:
            assert set(saved) <= set(c._store.ids())
            assert c.stats()["indexed"] <= c.stats()["entries"]
