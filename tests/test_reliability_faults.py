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
