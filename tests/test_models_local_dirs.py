"""Pull from the user's own model folders (LOCALSPEC_MODEL_DIRS), found by size and sha256, and
the progress views every pull draws."""

from __future__ import annotations

import io
import json

import pytest
from tests.gguf_factory import make_gguf
from tests.models_helpers import run_cli, sha256, subprocess_env, tmp_store, write_overlay  # noqa: F401

from localspec.errors import DownloadError
from localspec.models import ModelManager
from localspec.models.progress import ProgressEvent


def _entry(model_id: str, name: str, data: bytes, pinned: bool = True) -> None:
    digest = f', sha256 = "{sha256(data)}"' if pinned else ""
    write_overlay(
        f'[[models]]\nid = "{model_id}"\nrole = "embedding"\n'
        '  [[models.sources]]\n  kind = "hf"\n  repo = "nobody/unreachable"\n'
        f'  files = [{{ name = "{name}" }}]\n'
        '  [[models.sources]]\n  kind = "file"\n'
        f'  files = [{{ name = "{name}", size = {len(data)}{digest} }}]\n'
    )


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_pull_takes_a_pinned_model_from_a_local_folder_under_any_name(tmp_path, tmp_store, offline, monkeypatch):  # noqa: F811
    data = make_gguf(tmp_path / "m.gguf").read_bytes()
    _entry("tiny-local", "tiny.gguf", data)
    folder = tmp_path / "lmstudio" / "publisher" / "repo"
    folder.mkdir(parents=True)
    (folder / "renamed-by-the-user.gguf").write_bytes(data)
    (folder / "same-size-other-bytes.gguf").write_bytes(bytes(len(data)))  # same size, wrong hash: skipped
    monkeypatch.setenv("LOCALSPEC_MODEL_DIRS", str(tmp_path / "lmstudio"))
    events: list[ProgressEvent] = []
    rec = ModelManager().pull("tiny-local", progress=events.append)
    assert rec.downloaded and rec.path == tmp_store / "tiny-local" / "tiny.gguf"
    assert rec.path.read_bytes() == data
    assert "renamed-by-the-user.gguf" in rec.source
    assert not any(e.phase == "failed" for e in events)  # no network source was tried
    assert ModelManager().verify("tiny-local")


def test_a_local_copy_with_another_hash_is_not_taken(tmp_path, tmp_store, offline, monkeypatch):  # noqa: F811
    data = make_gguf(tmp_path / "m.gguf").read_bytes()
    _entry("tiny-local", "tiny.gguf", data)
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "tiny.gguf").write_bytes(data[:-1] + b"\x01")  # same name and size, one byte off
    monkeypatch.setenv("LOCALSPEC_MODEL_DIRS", str(folder))
    with pytest.raises(DownloadError) as err:
        ModelManager().pull("tiny-local")
    assert "not found in the model folders" in err.value.cause and str(folder) in err.value.cause
    assert "LOCALSPEC_MODEL_DIRS" in err.value.fix
    assert not (tmp_store / "tiny-local" / "tiny.gguf").exists()


def test_an_unpinned_file_is_never_taken_from_a_folder(tmp_path, tmp_store, offline, monkeypatch):  # noqa: F811
    data = make_gguf(tmp_path / "m.gguf").read_bytes()
    _entry("tiny-unpinned", "tiny.gguf", data, pinned=False)
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "tiny.gguf").write_bytes(data)
    monkeypatch.setenv("LOCALSPEC_MODEL_DIRS", str(folder))
    with pytest.raises(DownloadError):
        ModelManager().pull("tiny-unpinned")


def test_the_cli_pull_without_folders_says_how_to_set_them(tmp_path, tmp_store):  # noqa: F811
    data = make_gguf(tmp_path / "m.gguf").read_bytes()
    _entry("tiny-local", "tiny.gguf", data)
    env = subprocess_env(HF_HUB_OFFLINE="1", LOCALSPEC_MODEL_DIRS="")
    proc = run_cli("models", "pull", "tiny-local", env=env)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "LOCALSPEC_MODEL_DIRS" in proc.stderr and "localspec models import" in proc.stderr


# ---------------------------------------------------------------- progress views


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _feed(view, clock: FakeClock, total: int, seconds: int, per_tick: float = 0.1) -> None:
    """A download of `total` bytes at an even rate over `seconds`, reported every `per_tick` s."""
    ticks = int(seconds / per_tick)
    for i in range(ticks + 1):
        clock.t = i * per_tick
        view(ProgressEvent("m[/]x", "pypi", "download", total * i // ticks, total, "package 1/1 [bold]p"))


def test_plain_lines_report_once_a_second_with_rate_and_time_left():
    from localspec.cli.pull_progress import LinesView

    out, clock = io.StringIO(), FakeClock()
    view = LinesView(out, clock=clock)
    _feed(view, clock, total=100_000_000, seconds=10)
    lines = out.getvalue().splitlines()
    assert 10 <= len(lines) <= 12  # one a second plus the first and the last, not one per event
    middle = lines[5]
    assert middle.startswith("m[/]x: download ") and "10.0 MB/s" in middle and "left" in middle
    assert "[bold]p" in middle  # messages are printed as they are, never as markup
    assert "100.0 MB / 100.0 MB (100%)" in lines[-1]


def test_json_lines_parse_and_carry_rate_and_eta():
    from localspec.cli.pull_progress import JsonView

    out, clock = io.StringIO(), FakeClock()
    view = JsonView(out, clock=clock)
    _feed(view, clock, total=50_000_000, seconds=5)
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    assert all(r["event"] == "progress" and r["model"] == "m[/]x" for r in rows)
    mid = rows[len(rows) // 2]
    assert mid["bytes_per_second"] == pytest.approx(10_000_000, rel=0.01)
    assert mid["eta_s"] == pytest.approx((50_000_000 - mid["bytes_done"]) / 10_000_000, abs=0.2)


def test_bars_do_not_parse_model_ids_or_messages_as_markup():
    from localspec.cli.pull_progress import BarsView

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    view = BarsView(out)
    view(ProgressEvent("evil[/]id", "pypi", "start", message="trying [@click=app.quit]x"))
    view(ProgressEvent("evil[/]id", "pypi", "download", 10, 100, "note [red]x[/]"))
    view.close()
    text = out.getvalue()
    assert "evil[/]id" in text and "[@click=app.quit]x" in text
