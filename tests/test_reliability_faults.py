"""Faults on disk: broken model files, a model deleted under us, a full disk, corrupt databases.

Each must end in a clean LocalspecError (a cause and a fix, no traceback) or a logged recovery,
never in a llama.cpp abort, a partial file, or a face that cannot start. The process-level
faults (SIGTERM mid-generation, a model deleted while serving, killed downloads) are in
scripts/fault_campaign.py.
"""

from __future__ import annotations

import errno
import logging
import sqlite3
from pathlib import Path

import pytest

from localspec.errors import DiskFullError, IntegrityError, LocalspecError, ModelNotFoundError
from localspec.models import ModelManager, validate_gguf
from localspec.service import resolve_models
from localspec.tui.store import ChatStore
from tests.gguf_factory import make_gguf
from tests.models_helpers import tmp_store  # noqa: F401  (fixture: a private model store)


def _broken(kind: str, good: bytes, path):
    data = {
        "zero_bytes": b"",
        "wrong_magic": b"GGML" + good[4:],
        "truncated_header": good[:200],
        "truncated_tensors": good[: len(good) - 1024],
        "text_file": b"<html>404 Not Found</html>\n" * 40,
    }[kind]
    path.write_bytes(data)
    return path


KINDS = ["zero_bytes", "wrong_magic", "truncated_header", "truncated_tensors", "text_file"]


@pytest.fixture
def good_bytes(tmp_path) -> bytes:
    return make_gguf(tmp_path / "good.gguf", n_embd=64, n_layers=2).read_bytes()


@pytest.mark.parametrize("kind", KINDS)
def test_broken_gguf_is_a_clean_integrity_error(kind, good_bytes, tmp_path):
    bad = _broken(kind, good_bytes, tmp_path / f"{kind}.gguf")
    with pytest.raises(IntegrityError) as err:
        validate_gguf(bad)
    assert err.value.cause and err.value.fix and "\n" not in str(err.value)


@pytest.mark.parametrize("kind", KINDS)
def test_broken_installed_model_is_refused_before_llama_cpp(kind, good_bytes, tmp_path, tmp_store):  # noqa: F811
    """The store's size check or validate_gguf stops it; the engine is never asked to load it."""
    src = tmp_path / "tiny.gguf"
    src.write_bytes(good_bytes)
    rec = ModelManager().import_file(src, model_id="tiny-broken")
    _broken(kind, good_bytes, rec.path)
    with pytest.raises(LocalspecError) as err:
        resolve_models(target="tiny-broken", need_draft=False)
    assert isinstance(err.value, (IntegrityError, ModelNotFoundError))
    assert "tiny-broken" in str(err.value) or str(rec.path) in str(err.value)


@pytest.mark.parametrize("kind", ["zero_bytes", "wrong_magic", "truncated_tensors"])
def test_broken_embedding_model_is_a_clean_error(kind, tmp_path, minilm_path):
    from localspec.server.embeddings import EmbeddingModel

    good = minilm_path.read_bytes()
    bad = _broken(kind, good[: 4 << 20] if kind == "truncated_tensors" else good[:4096],
                  tmp_path / "emb.gguf")
    with pytest.raises(IntegrityError):
        EmbeddingModel(bad, n_threads=1)


def test_model_deleted_then_restart_names_the_file_and_the_pull(good_bytes, tmp_path, tmp_store):  # noqa: F811
    src = tmp_path / "tiny.gguf"
    src.write_bytes(good_bytes)
    rec = ModelManager().import_file(src, model_id="tiny-gone")
    rec.path.unlink()
    with pytest.raises(ModelNotFoundError) as err:
        resolve_models(target="tiny-gone", need_draft=False)
    assert "tiny-gone" in err.value.cause and "localspec models pull tiny-gone" in err.value.fix


def test_disk_full_during_import_leaves_nothing_behind(good_bytes, tmp_path, tmp_store, monkeypatch):  # noqa: F811
    from localspec.models import store

    src = tmp_path / "tiny.gguf"
    src.write_bytes(good_bytes * 1)
    calls = {"n": 0}
    real = store._write_chunk

    def full_after_first(fh, data):
        calls["n"] += 1
        if calls["n"] > 1 or len(data) > 4096:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fh, data)

    monkeypatch.setattr(store, "_write_chunk", full_after_first)
    with pytest.raises(DiskFullError) as err:
        ModelManager().import_file(src, model_id="tiny-full")
    assert "Disk full while writing" in str(err.value) and "\n" not in str(err.value)
    assert not [p for p in tmp_store.rglob("*") if p.is_file() and p.suffix in (".partial", ".gguf")]
    assert ModelManager().installed_path("tiny-full") is None
    monkeypatch.setattr(store, "_write_chunk", real)
    assert ModelManager().import_file(src, model_id="tiny-full").path.read_bytes() == good_bytes  # space back: works


@pytest.mark.parametrize("garbage", [b"", b"not a database" * 100, b"SQLite format 3\x00" + b"\xff" * 4000])
def test_corrupt_chat_db_is_moved_aside_and_the_app_starts(garbage, tmp_path, caplog):
    db = tmp_path / "chats.sqlite3"
    db.write_bytes(garbage)  # empty is a valid new database; the others are not databases at all
    with caplog.at_level(logging.WARNING):
        store = ChatStore(db)
    try:
        chat = store.create_chat("after the crash")
        store.add_message(chat.id, "user", "still works")
        assert [c.title for c in store.list_chats()] == ["after the crash"]
    finally:
        store.close()
    if garbage:
        assert store.recovered_from is not None and store.recovered_from.read_bytes() == garbage
        assert "moved it to" in caplog.text
    assert sqlite3.connect(db).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


# ---------------------------------------------------------------- more bytes than promised; quarantine


def test_stream_stops_before_the_chunk_that_passes_the_cap(tmp_path, monkeypatch):
    from localspec.models import store

    written: list[int] = []
    real = store._write_chunk
    monkeypatch.setattr(store, "_write_chunk", lambda fh, data: (written.append(len(data)), real(fh, data)))
    partial = tmp_path / "m.gguf.partial"
    endless = (b"x" * 1000 for _ in range(10**9))  # a source that never stops
    with pytest.raises(IntegrityError) as err:
        store.stream_to_partial(partial, endless, max_bytes=4500)
    assert err.value.cause == "m.gguf: more than the expected 4,500 bytes arrived; stopped and removed the partial file."
    assert sum(written) == 4000 and not partial.exists()


def test_a_file_that_grows_while_it_is_copied_is_refused(tmp_path, tmp_store):  # noqa: F811
    """/proc files stat as 0 bytes and then read as more: the copy stops at the size it was given."""
    from localspec.models.progress import Emitter
    from localspec.models.registry import ModelEntry
    from localspec.models.sources.file import copy_into_store
    from localspec.models.store import Store

    growing = Path("/proc/self/status")
    if not growing.is_file() or growing.stat().st_size != 0:
        pytest.skip("needs Linux /proc")
    entry = ModelEntry(id="grows", role="target")
    with pytest.raises(IntegrityError, match="more than the expected 0 bytes arrived"):
        copy_into_store(entry, growing, "grows.gguf", Store(tmp_store), Emitter(None, "grows"))
    assert [p for p in tmp_store.rglob("*") if p.is_file() and p.name != ".lock"] == []


def test_import_of_a_file_with_another_size_than_the_registry_copies_nothing(good_bytes, tmp_path, tmp_store,  # noqa: F811
                                                                           monkeypatch):
    from localspec.models import store
    from tests.models_helpers import write_overlay

    write_overlay('[[models]]\nid = "sized"\nrole = "target"\n  [[models.sources]]\n  kind = "file"\n'
                  f'  files = [{{ name = "sized.gguf", size = {len(good_bytes) - 1} }}]\n')
    src = tmp_path / "sized.gguf"
    src.write_bytes(good_bytes)
    monkeypatch.setattr(store, "_write_chunk", lambda fh, data: pytest.fail("nothing may be written"))
    with pytest.raises(IntegrityError) as err:
        ModelManager().import_file(src, model_id="sized")
    assert f"size {len(good_bytes):,} bytes, but sized is {len(good_bytes) - 1:,} bytes" in err.value.cause
    assert not (tmp_store / ".quarantine").exists() and ModelManager().installed_path("sized") is None


def _aged(path, age_s: float, now: float):
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"bad")
    os.utime(path, (now - age_s, now - age_s))
    return path


def test_quarantine_keeps_three_files_per_model_and_none_older_than_a_week(tmp_path, tmp_store):  # noqa: F811
    import time

    from localspec.models.store import Store

    st, now, hour, day = Store(tmp_store), time.time(), 3600, 86400
    q = tmp_store / ".quarantine"
    older = [_aged(q / "m" / f"old-{i}.gguf", (i + 1) * hour, now) for i in range(5)]
    stale = _aged(q / "other" / "stale.gguf", 8 * day, now)
    legacy_old, legacy_new = _aged(q / "legacy-old.gguf", 10 * day, now), _aged(q / "legacy-new.gguf", day, now)
    bad = tmp_path / "new.gguf"
    bad.write_bytes(b"new")
    dest = st.quarantine(bad, model_id="m", name="new.gguf")
    assert sorted(p.name for p in (q / "m").iterdir()) == sorted([dest.name, older[0].name, older[1].name])
    assert not stale.exists() and not (q / "other").exists()
    assert not legacy_old.exists() and legacy_new.exists()


def test_a_pull_prunes_the_quarantine(tmp_path, tmp_store):  # noqa: F811
    import time

    from tests.models_helpers import write_overlay

    now = time.time()
    q = tmp_store / ".quarantine"
    kept = [_aged(q / "m" / f"f{i}.gguf", i * 60, now) for i in range(3)]
    dropped = [_aged(q / "m" / "f9.gguf", 3600, now), _aged(q / "n" / "old.gguf", 30 * 86400, now)]
    write_overlay('[[models]]\nid = "nowhere"\nrole = "target"\n  [[models.sources]]\n  kind = "file"\n'
                  '  files = [{ name = "nowhere.gguf" }]\n')
    with pytest.raises(LocalspecError):
        ModelManager().pull("nowhere")  # no source can serve it; the pruning happens anyway
    assert all(p.exists() for p in kept) and not any(p.exists() for p in dropped)


def test_a_chat_db_locked_by_another_program_is_left_in_place_and_named(tmp_path, monkeypatch):
    """A second chat app (or a backup) holding the file's lock past the busy timeout is not a corrupt
    file: it was moved aside as one, every chat hidden, and the holder's journal left beside a new file."""
    from localspec.tui import store as store_module

    db = tmp_path / "chats.sqlite3"
    first = ChatStore(db)
    first.create_chat("kept")
    first.close()
    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_S", 0.05)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(LocalspecError) as err:
            ChatStore(db)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert "locked by another program" in err.value.cause and "\n" not in str(err.value)
    assert [p.name for p in tmp_path.iterdir() if "corrupt" in p.name] == []
    again = ChatStore(db)
    try:
        assert again.recovered_from is None and [c.title for c in again.list_chats()] == ["kept"]
    finally:
        again.close()
