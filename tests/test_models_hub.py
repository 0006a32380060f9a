"""Any GGUF from the Hub: `models pull hf.co/USER/REPO[:QUANT]`, `models search`, resume, draft
pairing, and every bad input with its one line. The real huggingface-hub client talks to the fake
Hub (tests/fake_hf_server.py) on loopback through HF_ENDPOINT."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter, LlamaFileType

from tests.fake_hf_server import COMMIT, FakeHub
from tests.gguf_factory import BASE_TOKENS, make_gguf
from tests.models_helpers import REPO, hub_env, run_cli, sha256, subprocess_env, tmp_store  # noqa: F401

from localspec.errors import DiskFullError, IncompatibleDraftError, ModelNotFoundError, UsageError
from localspec.models import hub
from localspec.models.hub import HubFile, HubRef, RepoListing, group_quants, parse_hub_ref, pick_quant, quant_of

TINY = "acme/tiny-GGUF"


def _shards(tmp_path: Path, count: int = 3) -> list[bytes]:
    """A split GGUF as llama-gguf-split writes one: split.* keys in every shard, tensors spread out."""
    out = []
    for i in range(count):
        p = tmp_path / f"shard{i}.gguf"
        w = GGUFWriter(str(p), "llama")
        w.add_uint16("split.no", i)
        w.add_uint16("split.count", count)
        w.add_int32("split.tensors.count", count)
        if i == 0:
            w.add_context_length(256)
            w.add_block_count(1)
            w.add_embedding_length(16)
            w.add_head_count(4)
            w.add_file_type(int(LlamaFileType.MOSTLY_Q8_0))
            w.add_tokenizer_model("llama")
            w.add_token_list(BASE_TOKENS)
        w.add_tensor(f"blk.{i}.x.weight", np.full((4, 16), i, dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        out.append(p.read_bytes())
    return out


@pytest.fixture
def files(tmp_path) -> dict[str, bytes]:
    (tmp_path / "g").mkdir()
    return {
        "q4": make_gguf(tmp_path / "g" / "q4.gguf", seed=1).read_bytes(),
        "q8": make_gguf(tmp_path / "g" / "q8.gguf", seed=2, n_embd=32).read_bytes(),
        "q2": make_gguf(tmp_path / "g" / "q2.gguf", seed=3).read_bytes(),
        "gpt2": make_gguf(tmp_path / "g" / "gpt2.gguf", tokenizer="gpt2", seed=4).read_bytes(),
    }


@pytest.fixture
def fake_hub(files, tmp_path):
    h = FakeHub()
    h.add(TINY, "Tiny-Q4_K_M.gguf", files["q4"])
    h.add(TINY, "Tiny-Q8_0.gguf", files["q8"])
    h.add(TINY, "README.md", b"# tiny\n")
    h.add("acme/noq4-GGUF", "NoQ4-Q2_K.gguf", files["q2"])
    h.add("acme/noq4-GGUF", "NoQ4-Q8_0.gguf", files["q8"])
    h.add("acme/noq4-GGUF", "NoQ4-Q4_K_S.gguf", files["q4"])
    for i, data in enumerate(_shards(tmp_path)):
        h.add("acme/split-GGUF", f"Q8_0/Split-Q8_0-0000{i + 1}-of-00003.gguf", data)
    h.add("acme/safetensors-only", "model.safetensors", b"\0" * 64)
    h.add("acme/gated-GGUF", "Gated-Q4_K_M.gguf", files["q4"])
    h.gated.add("acme/gated-GGUF")
    h.add("acme/private-GGUF", "Private-Q4_K_M.gguf", files["q4"])
    h.private.add("acme/private-GGUF")
    h.add("other/gpt2-GGUF", "G-Q4_K_M.gguf", files["gpt2"])
    h.downloads.update({TINY: 50, "acme/noq4-GGUF": 10})
    h.start()
    yield h
    h.stop()


@pytest.fixture
def env(tmp_path, fake_hub, tmp_store):  # noqa: F811
    return hub_env(fake_hub.url, tmp_path / "hf")


def cli_json(env, *args: str) -> tuple[int, list[dict], str]:
    proc = run_cli(*args, "--json", env=env)
    lines = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.strip().startswith("{")]
    return proc.returncode, lines, proc.stderr


def one_error_line(stderr: str) -> str:
    """The CLI's failure: one `error:` line (the cause), then its `fix:` line; returned joined."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    errors = [i for i, ln in enumerate(lines) if ln.startswith("error:")]
    assert len(errors) == 1, stderr
    fix = lines[errors[0] + 1].strip() if errors[0] + 1 < len(lines) else ""
    return lines[errors[0]] + (" Fix:" + fix.removeprefix("fix:") if fix.startswith("fix:") else "")


# ---------------------------------------------------------------- references, quants, picking


@pytest.mark.parametrize(("text", "want"), [
    ("hf.co/acme/tiny-GGUF:q4_k_m", HubRef(TINY, "Q4_K_M")),
    ("acme/tiny-GGUF:Q8_0", HubRef(TINY, "Q8_0")),
    ("huggingface.co/acme/tiny-GGUF", HubRef(TINY)),
    ("https://huggingface.co/acme/tiny-GGUF/blob/main/Tiny-Q8_0.gguf", HubRef(TINY, None, "main", "Tiny-Q8_0.gguf")),
    ("https://hf.co/acme/tiny-GGUF/resolve/v1.0/sub/x-00001-of-00002.gguf?download=true",
     HubRef(TINY, None, "v1.0", "sub/x-00001-of-00002.gguf")),
    ("qwen-coder-1.5b", None),  # a registry id
])
def test_references(text, want):
    assert parse_hub_ref(text) == want


@pytest.mark.parametrize("text", ["https://example.com/acme/tiny-GGUF", "hf.co/acme", "acme/tiny-GGUF:Q4 K",
                                  "hf.co/acme/../x", "https://huggingface.co/acme/t/blob/main/../x.gguf"])
def test_malformed_references_are_usage_errors(text):
    with pytest.raises(UsageError) as err:
        parse_hub_ref(text)
    assert "hf.co/USER/REPO" in err.value.fix


@pytest.mark.parametrize(("name", "quant"), [
    ("Qwen2.5-Coder-7B-Instruct-Q4_K_M.gguf", "Q4_K_M"), ("llama-2-7b.Q5_K_S.gguf", "Q5_K_S"),
    ("m-IQ4_XS-00002-of-00003.gguf", "IQ4_XS"), ("x-UD-Q4_K_XL.gguf", "Q4_K_XL"), ("phi-3-mini-f16.gguf", "F16"),
    ("tinyllama.gguf", None), ("Qwen2.5-1.5B.gguf", None),
])
def test_quant_from_file_name(name, quant):
    assert quant_of(name) == quant


def _listing(*files: tuple[str, int]) -> RepoListing:
    quants, cut = group_quants(HubFile(p, s, None) for p, s in files)
    return RepoListing("u/r", "main", COMMIT, False, quants, cut)


def test_splits_group_in_order_and_an_incomplete_split_is_not_offered():
    listing = _listing(("Q8_0/M-Q8_0-00002-of-00002.gguf", 5), ("Q8_0/M-Q8_0-00001-of-00002.gguf", 7),
                       ("M-Q2_K-00001-of-00003.gguf", 3), ("M-Q2_K-00003-of-00003.gguf", 3),
                       ("mmproj-M-F16.gguf", 9), ("M-Q4_K_S.gguf", 4))
    assert [q.quant for q in listing.quants] == ["Q8_0", "Q4_K_S"]
    q8 = listing.quants[0]
    assert [f.path for f in q8.files] == ["Q8_0/M-Q8_0-00001-of-00002.gguf", "Q8_0/M-Q8_0-00002-of-00002.gguf"]
    assert q8.size == 12
    assert listing.incomplete_splits == ("M-Q2_K (2 of 3 shards)",)


def test_a_hostile_listing_offers_only_safe_paths():
    from types import SimpleNamespace as NS

    from localspec.models.hub import _files_of

    lfs = NS(sha256="AB" * 32, size=5)
    siblings = [NS(rfilename=p, size=5, lfs=lfs) for p in (
        "../../etc/x-Q4_K_M.gguf", "/abs-Q4_K_M.gguf", ".hidden/x-Q4_K_M.gguf", "a\\b-Q4_K_M.gguf",
        "ok/M-Q4_K_M.gguf", "bad\nname-Q8_0.gguf", "A" * 250 + "-Q4_K_M.gguf", "F" * 250 + "/M-Q4_K_M.gguf")]
    siblings += [NS(rfilename="M-Q8_0.gguf", size=-1, lfs=None)]
    files = _files_of(siblings)
    assert [(f.path, f.sha256) for f in files] == [("ok/M-Q4_K_M.gguf", "ab" * 32)]


def test_quant_choice():
    listing = _listing(("M-Q8_0.gguf", 80), ("M-Q4_K_M.gguf", 40), ("M-Q2_K.gguf", 20))
    assert pick_quant(listing, HubRef("u/r"), lambda q: True).quant.quant == "Q4_K_M"  # the default
    assert pick_quant(listing, HubRef("u/r", "Q8_0"), lambda q: True).quant.quant == "Q8_0"
    no_default = _listing(("M-Q8_0.gguf", 80), ("M-Q5_K_M.gguf", 50), ("M-IQ4_XS.gguf", 35), ("M-Q2_K.gguf", 20))
    pick = pick_quant(no_default, HubRef("u/r"), lambda q: True)
    assert pick.quant.quant == "IQ4_XS" and "no Q4_K_M" in pick.note and "IQ4_XS" in pick.note  # 4.25 is nearest 4.85
    # Nearest among those that fit: with IQ4_XS too big, Q2_K (2.96) is out-ranked by Q5_K_M only if it fits.
    small = pick_quant(no_default, HubRef("u/r"), lambda q: q.size <= 20)
    assert small.quant.quant == "Q2_K" and "that fits" in small.note
    with pytest.raises(ModelNotFoundError) as err:
        pick_quant(listing, HubRef("u/r", "Q6_K"), lambda q: True)
    assert "no Q6_K" in err.value.cause and "Q8_0, Q4_K_M, Q2_K" in err.value.fix


def test_login_command_follows_the_installed_huggingface_hub(monkeypatch):
    import importlib.util

    from huggingface_hub.cli import auth  # noqa: F401  the installed version has `hf auth`

    assert hub.login_command() == "hf auth login"
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "huggingface_hub.cli.auth" else real(name, *a))
    assert hub.login_command() == "huggingface-cli login"


# ---------------------------------------------------------------- pulling


def test_pull_by_reference_registers_an_id_usable_everywhere(env, fake_hub, files, tmp_path, tmp_store):  # noqa: F811
    code, lines, err = cli_json(env, "models", "pull", "hf.co/acme/tiny-GGUF:q8_0")
    assert code == 0, err
    done = lines[-1]
    assert done["event"] == "installed" and done["model"] == "acme-tiny-q8_0" and done["quant"] == "Q8_0"
    assert Path(done["path"]).read_bytes() == files["q8"]
    assert str(Path(done["path"])).startswith(str(tmp_path / "hf" / "hub"))  # the HF cache tools see it
    assert [r.path for r in fake_hub.gets()] == [f"/{TINY}/resolve/{COMMIT}/Tiny-Q8_0.gguf"]  # pinned to the commit
    manifest = json.loads((tmp_store / "acme-tiny-q8_0" / "manifest.json").read_text())
    assert manifest["files"][0]["sha256"] == sha256(files["q8"])

    # The id, the reference as pulled and its other spellings all name it.
    for name in ("acme-tiny-q8_0", "hf.co/acme/tiny-GGUF:Q8_0", "acme/tiny-GGUF:q8_0"):
        proc = run_cli("models", "info", name, "--json", env=env)
        assert proc.returncode == 0, proc.stderr
        d = json.loads(proc.stdout)
        assert d["model_id"] == "acme-tiny-q8_0" and d["path"] == done["path"]
    assert d["quant"] == "F32" and d["draft"]["target"] == "acme-tiny-q8_0"  # metadata from the GGUF header
    listed = json.loads(run_cli("models", "list", "--json", "--no-fit", env=env).stdout)
    row = next(r for r in listed if r["id"] == "acme-tiny-q8_0")
    assert row["installed"] and row["aliases"] == ["hf.co/acme/tiny-GGUF:Q8_0"] and row["unpinned"] is None
    verify = json.loads(run_cli("models", "verify", "acme-tiny-q8_0", "--json", env=env).stdout)
    assert verify == [{"id": "acme-tiny-q8_0", "status": "ok", "detail": ""}]  # pinned to the Hub's LFS sha256

    # Pulling again downloads nothing and asks the Hub nothing.
    n = len(fake_hub.requests)
    code, lines, err = cli_json(env, "models", "pull", "acme/tiny-GGUF:Q8_0")
    assert code == 0 and lines[-1]["downloaded"] is False and len(fake_hub.requests) == n, err

    assert run_cli("models", "rm", "hf.co/acme/tiny-GGUF:Q8_0", env=env).returncode == 0
    assert not (tmp_store / "acme-tiny-q8_0").exists()


def test_default_quant_and_the_closest_one(env, fake_hub, files):
    code, lines, err = cli_json(env, "models", "pull", "hf.co/acme/tiny-GGUF")
    assert code == 0, err
    assert lines[-1]["quant"] == "Q4_K_M" and lines[-1]["quant_note"] is None
    proc = run_cli("models", "pull", "acme/noq4-GGUF", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "quant: acme/noq4-GGUF has no Q4_K_M: took Q4_K_S, the nearest in bits per weight (4.58 vs 4.85)" \
        in proc.stdout
    assert "acme-noq4-q4_k_s: installed from hf acme/noq4-GGUF" in proc.stdout
    assert [r.path.rsplit("/", 1)[-1] for r in fake_hub.gets()][-1] == "NoQ4-Q4_K_S.gguf"


def test_a_file_url_pulls_that_file(env, fake_hub, files):
    url = f"https://huggingface.co/{TINY}/blob/main/Tiny-Q8_0.gguf"
    code, lines, err = cli_json(env, "models", "pull", url)
    assert code == 0, err
    assert Path(lines[-1]["path"]).read_bytes() == files["q8"]
    proc = run_cli("models", "info", url, "--json", env=env)
    assert json.loads(proc.stdout)["model_id"] == lines[-1]["model"]


def test_split_gguf_pulls_every_shard_in_order(env, fake_hub, tmp_path, tmp_store):  # noqa: F811
    code, lines, err = cli_json(env, "models", "pull", "hf.co/acme/split-GGUF:Q8_0")
    assert code == 0, err
    assert Path(lines[-1]["path"]).name == "Split-Q8_0-00001-of-00003.gguf"  # llama.cpp loads the first shard
    manifest = json.loads((tmp_store / lines[-1]["model"] / "manifest.json").read_text())
    assert [f["name"] for f in manifest["files"]] == [f"Split-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    for f in manifest["files"]:
        assert "/snapshots/" in f["path"] and f["path"].endswith("/Q8_0/" + f["name"])
        assert f["sha256"] == sha256(fake_hub.files[("acme/split-GGUF", "Q8_0/" + f["name"])])
    assert len(fake_hub.gets()) == 3


def test_killed_pull_resumes_where_it_stopped(env, fake_hub, tmp_path):
    from huggingface_hub import constants

    chunk = constants.DOWNLOAD_CHUNK_SIZE  # huggingface-hub writes in pieces of this size
    big = make_gguf(tmp_path / "big.gguf", pad_floats=(chunk + 3 * 1024 * 1024) // 4).read_bytes()
    fake_hub.add("acme/big-GGUF", "Big-Q4_K_M.gguf", big)
    fake_hub.stall_first_get_after = chunk + 1024 * 1024
    cmd = [sys.executable, "-m", "localspec", "models", "pull", "hf.co/acme/big-GGUF"]
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    partial = tmp_path / "hf" / "hub" / "models--acme--big-GGUF" / "blobs" / f"{sha256(big)}.localspec.incomplete"
    try:
        assert fake_hub.stalled.wait(60), "the download never started"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (partial.is_file() and partial.stat().st_size >= chunk):
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)  # as a closed laptop lid or an OOM kill would
        proc.wait(10)
    finally:
        fake_hub.release.set()
    kept = partial.stat().st_size
    assert kept >= chunk and kept < len(big)

    out = run_cli("models", "pull", "hf.co/acme/big-GGUF", "--json", env=env)
    assert out.returncode == 0, out.stderr
    second = fake_hub.gets()[-1]
    assert second.headers.get("range") == f"bytes={kept}-"
    assert second.served == len(big) - kept  # only what was missing crossed the wire
    done = json.loads(out.stdout.splitlines()[-1])
    assert Path(done["path"]).read_bytes() == big and not partial.exists()


def test_hash_mismatch_is_quarantined_and_nothing_is_registered(env, fake_hub, files, tmp_store):  # noqa: F811
    fake_hub.etag_override["Tiny-Q4_K_M.gguf"] = "ab" * 32  # the Hub's LFS sha256 says another file
    proc = run_cli("models", "pull", "hf.co/acme/tiny-GGUF:Q4_K_M", env=env)
    assert proc.returncode == 1
    line = one_error_line(proc.stderr)
    assert "does not match the Hub's LFS sha256" in line and ".quarantine" in line
    quarantined = list((tmp_store / ".quarantine" / "acme-tiny-q4_k_m").iterdir())
    assert len(quarantined) == 1 and quarantined[0].read_bytes() == files["q4"]
    listed = json.loads(run_cli("models", "list", "--json", "--no-fit", env=env).stdout)
    assert "acme-tiny-q4_k_m" not in [r["id"] for r in listed]
    assert not list((Path(env["HF_HOME"]) / "hub").rglob("blobs/" + "ab" * 32 + "*"))


@pytest.mark.parametrize(("ref", "says", "fix"), [
    ("hf.co/acme/safetensors-only", "acme/safetensors-only has no GGUF model files", "models search"),
    ("hf.co/acme/tiny-GGUF:Q6_K", "acme/tiny-GGUF has no Q6_K quant", "Q8_0, Q4_K_M"),
    ("hf.co/acme/gated-GGUF:Q4_K_M", "acme/gated-GGUF is a gated repo", "hf auth login"),
    ("hf.co/acme/private-GGUF", "acme/private-GGUF was not found on the Hub", "hf auth login"),
    ("hf.co/acme/nope-GGUF", "or it is private", "models search"),
    ("hf.co/acme/tiny-GGUF:Q4 K", "is not a Hugging Face model", "hf.co/USER/REPO"),
])
def test_bad_input_is_one_line_with_the_fix(env, fake_hub, ref, says, fix):
    proc = run_cli("models", "pull", ref, env=env)
    assert proc.returncode == (2 if " " in ref else 1), proc.stderr
    line = one_error_line(proc.stderr)
    assert says in line and fix in line.split("Fix:")[-1], line
    assert fake_hub.gets() == []  # refused before any download


def test_a_file_name_too_long_for_the_file_system_is_one_line_before_download(env, fake_hub, files, tmp_store):  # noqa: F811
    """The Hub allows names no file system takes; the HF cache would need one as a file name."""
    fake_hub.add("acme/long-GGUF", "L" * 300 + "-Q4_K_M.gguf", files["q4"])
    proc = run_cli("models", "pull", "hf.co/acme/long-GGUF", env=env)
    assert proc.returncode == 1, proc.stderr
    line = one_error_line(proc.stderr)
    assert "acme/long-GGUF has no GGUF model files (1 GGUF file name(s) not taken: too long" in line, line
    assert fake_hub.gets() == [] and not (tmp_store / "acme-long-q4_k_m").exists()


def test_file_larger_than_free_disk_is_refused_before_downloading(fake_hub, tmp_path, tmp_store, monkeypatch):  # noqa: F811
    import shutil
    from collections import namedtuple

    from huggingface_hub import constants

    from localspec.models import ModelManager

    monkeypatch.setattr(constants, "ENDPOINT", fake_hub.url)  # what HF_ENDPOINT sets at import, in-process
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", fake_hub.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-tokens"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 1000, 1000))
    size = len(fake_hub.files[(TINY, "Tiny-Q8_0.gguf")])
    with pytest.raises(DiskFullError) as err:
        ModelManager().pull_hub("hf.co/acme/tiny-GGUF:Q8_0")
    assert f"it needs {size:,} bytes" in err.value.cause and "has 1,000 (1.0 KB) free" in err.value.cause
    assert "nothing was downloaded" in err.value.cause and "HF_HUB_CACHE" in err.value.fix
    assert fake_hub.gets() == []


# ---------------------------------------------------------------- draft pairing


def test_draft_pairing_for_any_target(tmp_path, tmp_store, monkeypatch):  # noqa: F811
    from localspec.models import ModelManager
    from localspec.service import resolve_models

    mm = ModelManager()
    big = make_gguf(tmp_path / "big.gguf", n_embd=64, n_layers=4, seed=1)
    small = make_gguf(tmp_path / "small.gguf", seed=2)
    other = make_gguf(tmp_path / "other.gguf", tokenizer="gpt2", seed=3)
    mm.import_file(big, model_id="big-target")
    alone = mm.pair_draft("big-target")
    assert alone.draft_id is None and "lookup and prediction" in alone.summary

    mm.import_file(other, model_id="other-tok", role="draft")
    mm.import_file(small, model_id="small-draft", role="draft")
    pairing = mm.pair_draft("big-target")
    assert pairing.draft_id == "small-draft" and "same llama tokenizer" in pairing.why
    refused = {c.model_id: c for c in pairing.candidates}["other-tok"]
    assert refused.compat.value == "incompatible" and "tokenizer" in refused.detail
    assert "big-target" not in [c.model_id for c in mm.pair_draft("small-draft").candidates]  # never a larger draft

    # What `generate --model big-target` loads: the paired draft, found without --draft-model.
    files, _ = resolve_models(target="big-target")
    assert files.draft_id == "small-draft" and files.draft == mm.installed_path("small-draft")
    # A draft with another tokenizer, named explicitly, is refused with the reason.
    with pytest.raises(IncompatibleDraftError) as err:
        resolve_models(target="big-target", draft="other-tok")
    assert "tokenizer 'gpt2' differs from target 'llama'" in err.value.cause

    info = run_cli("models", "info", "big-target", env=subprocess_env())
    assert "auto drafts with small-draft" in info.stdout and "other-tok" in info.stdout


def test_generate_logs_the_paired_draft(tmp_path, tmp_store):  # noqa: F811
    """The metrics row names the draft that was loaded, not the profile's (which may not fit the target)."""
    import argparse

    from localspec.cli.generate_cmd import _log_metrics
    from localspec.engine.config import GenerationRequest
    from localspec.engine.events import Done, Stats
    from localspec.metrics import fetch_rows, open_reader
    from localspec.metrics.store import default_db_path
    from localspec.models import ModelManager

    mm = ModelManager()
    mm.import_file(make_gguf(tmp_path / "big.gguf", n_embd=64, n_layers=4), model_id="big-target")
    mm.import_file(make_gguf(tmp_path / "small.gguf", seed=2), model_id="small-draft", role="draft")
    args = argparse.Namespace(profile=None, model="big-target", draft_model=None)
    done = Done("stop", Stats(mode="draft", completion_tokens=3, drafted=2, accepted=1), "hi")
    _log_metrics(args, GenerationRequest(prompt="x", max_tokens=3), done, 5.0, True, mm.installed_path("small-draft"))
    conn = open_reader(default_db_path())
    try:
        rows = list(fetch_rows(conn))
    finally:
        conn.close()
    assert [(r["target_model"], r["draft_model"]) for r in rows] == [("big-target", "small-draft")]


# ---------------------------------------------------------------- search


def test_search_lists_quants_sizes_and_fit_without_downloading(env, fake_hub, files):
    proc = run_cli("models", "search", "GGUF", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    repos = [h["repo"] for h in d["hub"]]
    assert repos[:2] == [TINY, "acme/noq4-GGUF"] and "acme/private-GGUF" not in repos  # most downloaded first
    tiny = d["hub"][0]
    assert [(q["quant"], q["size"]) for q in tiny["quants"]] == [("Q8_0", len(files["q8"])), ("Q4_K_M", len(files["q4"]))]
    assert tiny["quants"][0]["pull"] == "hf.co/acme/tiny-GGUF:Q8_0"
    assert tiny["quants"][0]["fit"] in ("fits in RAM", "fits in VRAM")  # kilobytes fit anywhere
    split = next(h for h in d["hub"] if h["repo"] == "acme/split-GGUF")
    assert split["quants"][0]["files"] == 3
    assert next(h for h in d["hub"] if h["repo"] == "acme/gated-GGUF")["gated"] is True
    assert fake_hub.gets() == []
    text = run_cli("models", "search", "tiny", env=env)
    assert text.returncode == 0 and "hf.co/acme/tiny-GGUF" in text.stdout and "Q4_K_M" in text.stdout


def test_search_offline_or_unreachable_is_one_line_and_the_registry_still_answers(env, fake_hub, tmp_path):
    offline = run_cli("models", "search", "qwen coder", env=dict(env, HF_HUB_OFFLINE="1"))
    assert offline.returncode == 1
    line = one_error_line(offline.stderr)
    assert "Offline (HF_HUB_OFFLINE is set)" in line and "Unset HF_HUB_OFFLINE" in line
    assert "qwen2.5-coder-1.5b-instruct-q4_k_m" in offline.stdout  # the curated registry
    assert fake_hub.requests == []

    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    start = time.monotonic()
    down = run_cli("models", "search", "qwen", "--json", env=dict(env, HF_ENDPOINT=f"http://127.0.0.1:{port}"))
    assert down.returncode == 1 and time.monotonic() - start < 20
    assert "Cannot reach the Hub" in one_error_line(down.stderr)
    d = json.loads(down.stdout)
    assert d["hub"] == [] and "Cannot reach the Hub" in d["hub_error"] and d["registry"]


@pytest.mark.parametrize("body", [
    b"<html><body>Sign in to the guest network</body></html>",  # a captive portal
    b'{"id": "acme/tiny-GGUF", "sha": "%s", "siblings": ["Tiny-Q4_K_M.gguf"]}' % COMMIT.encode(),  # another shape
    b'[{"id": "acme/tiny-GGUF", "siblings": null}, 7]',
])
def test_an_answer_that_is_not_the_hub_api_is_one_line_saying_so(env, fake_hub, body):
    """The Hub was reached and answered something else: not "Cannot reach the Hub", nor a traceback."""
    fake_hub.api_body = body
    pull = run_cli("models", "pull", "hf.co/acme/tiny-GGUF", env=env)
    assert pull.returncode == 1, pull.stderr
    line = one_error_line(pull.stderr)
    assert f"The Hub ({fake_hub.url}) answered" in line and "not what the Hub's API sends" in line, line
    assert "Check HF_ENDPOINT" in line.split("Fix:")[-1]
    # A search whose list parses shows each repo's failure in its row; one that does not is the error line.
    search = run_cli("models", "search", "tiny", env=env)
    said = search.stdout + search.stderr
    assert "Traceback" not in said and "Cannot reach" not in said and "not what the Hub's API sends" in said, said
    assert fake_hub.gets() == []


def test_a_file_the_registry_already_describes_is_pulled_as_that_entry(env, fake_hub, files, tmp_store):  # noqa: F811
    """hf.co/... of a curated model installs the registry's entry (its id, its pins, its mirrors)."""
    from tests.models_helpers import write_overlay

    write_overlay('[[models]]\nid = "curated-tiny"\nrole = "target"\n  [[models.sources]]\n  kind = "hf"\n'
                  f'  repo = "{TINY}"\n  files = [{{ name = "Tiny-Q4_K_M.gguf", sha256 = "{sha256(files["q4"])}" }}]\n')
    code, lines, err = cli_json(env, "models", "pull", "hf.co/acme/tiny-GGUF")
    assert code == 0, err
    assert lines[-1]["model"] == "curated-tiny" and (tmp_store / "curated-tiny" / "manifest.json").is_file()
    listed = json.loads(run_cli("models", "list", "--json", "--no-fit", env=env).stdout)
    assert "acme-tiny-q4_k_m" not in [r["id"] for r in listed]  # no second entry for the same file


def test_a_hub_reference_named_to_a_verb_is_pulled_on_first_use(env, fake_hub, files, tmp_store):  # noqa: F811
    """`generate`, `serve` and `edit --model hf.co/USER/REPO:QUANT` pull a reference not pulled yet,
    as `ollama run hf.co/...` does; before, only registry ids were fetched on first use."""
    script = ("import sys; from localspec.cli.models_cmd import ensure_models; "
              "ensure_models(ids=[sys.argv[1], None])")
    proc = subprocess.run([sys.executable, "-c", script, "hf.co/acme/tiny-GGUF:Q8_0"], capture_output=True,
                          text=True, env=env, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "First use: fetching hf.co/acme/tiny-GGUF:Q8_0" in proc.stderr
    assert (tmp_store / "acme-tiny-q8_0" / "manifest.json").exists()
    n = len(fake_hub.requests)
    again = subprocess.run([sys.executable, "-c", script, "acme/tiny-GGUF:q8_0"], capture_output=True, text=True,
                           env=env, timeout=120, cwd=REPO)
    assert again.returncode == 0 and "First use" not in again.stderr and len(fake_hub.requests) == n, again.stderr
    unknown = subprocess.run([sys.executable, "-c", script, "no-such-model"], capture_output=True, text=True,
                             env=env, timeout=120, cwd=REPO)
    assert unknown.returncode != 0 and "ModelNotFoundError" in unknown.stderr and len(fake_hub.requests) == n
