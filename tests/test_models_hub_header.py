"""A Hub GGUF's header read with HTTP range requests (localspec/models/hub_header.py): what search
shows and what pull checks before downloading. The real huggingface-hub session talks to the fake
Hub (tests/fake_hf_server.py), which serves closed ranges and counts the bytes it sends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fake_hf_server import FakeHub
from tests.gguf_factory import BASE_TOKENS, make_gguf
from tests.models_helpers import hub_env, run_cli, subprocess_env, tmp_store  # noqa: F401

from localspec.models.compat import check_draft_compat
from localspec.models.gguf_info import read_header
from localspec.models.gguf_summary import read_gguf_info
from localspec.models.hub_header import (
    FIRST_READ_BYTES,
    Depth,
    Outcome,
    read_remote_header,
    remote_fit,
)

REPO_ID = "acme/big-vocab-GGUF"
BIG = "Big-Q4_K_M.gguf"
# Enough tokens that their texts run past the first read: the reader must grow its range.
VOCAB = BASE_TOKENS + [f"word{i:05d}" for i in range(12_000)]


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("hub-header")
    return {
        # ~8 MB of weights behind a ~250 KB header
        "big": make_gguf(d / "big.gguf", tokens=VOCAB, n_layers=4, n_embd=32, n_head=4, n_head_kv=2, n_ctx=8192,
                         pad_floats=2_000_000, seed=1),
        "draft": make_gguf(d / "draft.gguf", tokens=VOCAB, seed=2),
        "gpt2": make_gguf(d / "gpt2.gguf", tokens=VOCAB, tokenizer="gpt2", seed=3),
    }


@pytest.fixture
def hub(gguf_files, tmp_path, monkeypatch):
    from huggingface_hub import constants

    h = FakeHub()
    h.add(REPO_ID, BIG, gguf_files["big"].read_bytes())
    full = gguf_files["draft"].read_bytes()
    h.add("acme/draft-GGUF", "Draft-Q4_K_M.gguf", full)
    h.add("other/gpt2-GGUF", "G-Q4_K_M.gguf", gguf_files["gpt2"].read_bytes())
    h.add("acme/bad-GGUF", "Garbage-Q4_K_M.gguf", b"GGUF\x03\x00\x00\x00" + b"\xff" * 4000)
    h.add("acme/bad-GGUF", "Cut-Q8_0.gguf", full[:300])  # ends inside its key/values
    h.start()
    monkeypatch.setattr(constants, "ENDPOINT", h.url)  # what HF_ENDPOINT sets at import, in-process
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", h.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-tokens"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    yield h
    h.stop()


def _read(hub: FakeHub, repo: str, name: str, depth: Depth):
    size = len(hub.files[(repo, name)])
    return read_remote_header(repo, name, "main", size, depth=depth), size


def test_header_from_ranged_reads_equals_the_local_one_and_costs_a_fraction_of_the_file(hub, gguf_files):
    got, size = _read(hub, REPO_ID, BIG, Depth.TOKENS)
    assert got.outcome is Outcome.READ and got.meta is not None, got.detail
    local = read_gguf_info(gguf_files["big"])
    remote = got.info
    assert remote is not None
    for field in ("architecture", "context_length", "block_count", "embedding_length", "head_count",
                  "head_count_kv", "key_length", "value_length", "vocab_size", "tokenizer_model",
                  "bos_token_id", "eos_token_id", "has_chat_template"):
        assert getattr(remote, field) == getattr(local, field), field
    assert remote.kv_bytes_per_token() == local.kv_bytes_per_token() > 0
    assert got.meta.strings("tokenizer.ggml.tokens") == read_header(gguf_files["big"]).strings("tokenizer.ggml.tokens")
    reads = hub.header_reads()
    assert got.requests == len(reads) > 1  # the first range was too short: it grew
    served = hub.served(reads)
    assert served == got.bytes_read < size // 20  # far less than the file
    assert hub.gets() == []  # no download


def test_fit_depth_stops_at_the_token_list(hub):
    got, _ = _read(hub, REPO_ID, BIG, Depth.FIT)
    assert got.outcome is Outcome.READ and got.info is not None
    assert got.info.vocab_size == len(VOCAB) and got.info.kv_bytes_per_token()
    assert got.requests == 1 and got.bytes_read == FIRST_READ_BYTES


def test_fit_counts_the_kv_cache_that_the_size_alone_misses(hub):
    got, size = _read(hub, REPO_ID, BIG, Depth.FIT)
    info = got.info
    assert info is not None
    per_tok = info.kv_bytes_per_token()
    assert per_tok == 4 * 2 * (8 + 8) * 2  # layers * kv heads * (k + v head dim) * f16
    # RAM that holds the weights and buffers but not 8192 positions of KV cache.
    from localspec.models.fit import compute_allowance

    ram = int((size + compute_allowance(size, len(VOCAB)) + 4096 * per_tok) / 0.9)
    by_header = remote_fit(size, got, 8192, ram=ram, vram=0)
    assert by_header.estimate is not None and by_header.estimate.kv_bytes == 8192 * per_tok
    assert by_header.verdict == "too large"
    assert remote_fit(size, None, 8192, ram=ram, vram=0).verdict == "fits in RAM"  # size only: wrong
    # The context is the profile's, capped at the model's own.
    assert remote_fit(size, got, 1 << 20, ram=ram, vram=0).estimate.n_ctx == 8192  # type: ignore[union-attr]


def test_a_server_without_ranges_falls_back_to_the_size_and_says_so(hub):
    hub.ignore_range = True
    got, size = _read(hub, REPO_ID, BIG, Depth.TOKENS)
    assert got.outcome is Outcome.NO_RANGE and got.meta is None and got.bytes_read == 0
    fit = remote_fit(size, got, 4096, ram=1 << 40, vram=None)
    assert fit.estimate is None and "from the file size only: the server ignores HTTP range requests" in fit.line


def test_a_server_answering_short_ranges_is_not_followed(hub):
    hub.range_cap = 16 << 10  # a 206 of 16 KiB for every 64 KiB asked
    got, size = _read(hub, REPO_ID, BIG, Depth.TOKENS)
    assert got.outcome is Outcome.UNREACHABLE and got.meta is None and got.requests == 1
    assert "a short range (16384 of 65536 bytes)" in got.detail
    assert "from the file size only" in remote_fit(size, got, 4096, ram=1 << 40, vram=None).line


def test_an_empty_file_sends_no_range(hub):
    got = read_remote_header(REPO_ID, BIG, "main", 0, depth=Depth.FIT)
    assert got.outcome is Outcome.UNREACHABLE and got.requests == 0 and hub.requests == []


def test_the_number_of_range_requests_is_capped(monkeypatch):
    from localspec.models import hub_header
    from localspec.models.gguf_info import HeaderIncomplete

    def never_enough(buf, total, source, *, vocab_count_only=False):
        raise HeaderIncomplete(len(buf) + 1)

    monkeypatch.setattr(hub_header, "FIRST_READ_BYTES", 1)
    monkeypatch.setattr(hub_header, "_fetch_range", lambda url, start, end: bytes(end - start + 1))
    monkeypatch.setattr(hub_header, "parse_header_prefix", never_enough)
    got = read_remote_header(REPO_ID, BIG, "main", 1 << 20, depth=Depth.FIT, max_bytes=1 << 20)
    assert got.outcome is Outcome.TOO_LONG and got.requests == hub_header.MAX_REQUESTS


@pytest.mark.parametrize(("name", "says"), [
    ("Garbage-Q4_K_M.gguf", "acme/bad-GGUF/Garbage-Q4_K_M.gguf is not a valid GGUF file"),
    ("Cut-Q8_0.gguf", "header is cut off at byte 300"),
])
def test_garbage_or_truncated_header_is_one_line(hub, name, says):
    got, _ = _read(hub, "acme/bad-GGUF", name, Depth.TOKENS)
    assert got.outcome is Outcome.INVALID and got.error is not None
    assert says in got.error.cause and "\n" not in got.error.cause


def test_tokenizer_check_on_remote_headers(hub, gguf_files):
    target, _ = _read(hub, REPO_ID, BIG, Depth.TOKENS)
    assert target.meta is not None
    ok = check_draft_compat(target.meta, gguf_files["draft"])
    assert ok.tokens_compared > len(VOCAB) - 10
    from localspec.errors import IncompatibleDraftError

    with pytest.raises(IncompatibleDraftError) as err:
        check_draft_compat(target.meta, gguf_files["gpt2"])
    assert "tokenizer 'gpt2' differs from target 'llama'" in err.value.cause


# ---------------------------------------------------------------- the CLI: search and pull


@pytest.fixture
def env(tmp_path, hub, tmp_store):  # noqa: F811
    return hub_env(hub.url, tmp_path / "hf")


def _error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    errors = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, stderr
    return errors[0]


def test_search_judges_fit_from_the_header(env, hub, gguf_files):
    proc = run_cli("models", "search", "big-vocab", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout)["hub"][0]
    per_tok = read_gguf_info(gguf_files["big"]).kv_bytes_per_token()
    q = row["quants"][0]
    assert q["fit_from"] == "header" and 0 < q["n_ctx"] <= 8192 and q["kv_bytes"] == q["n_ctx"] * per_tok
    assert row["header"]["read"] is True and row["header"]["bytes_read"] == FIRST_READ_BYTES
    assert hub.gets() == []
    text = run_cli("models", "search", "big-vocab", env=env)
    assert text.returncode == 0 and "KV cache at n_ctx" in text.stdout


def test_search_without_range_support_says_fit_is_from_the_size(env, hub):
    hub.ignore_range = True
    d = json.loads(run_cli("models", "search", "big-vocab", "--json", env=env).stdout)
    row = d["hub"][0]
    assert row["quants"][0]["fit_from"] == "size" and row["quants"][0]["kv_bytes"] is None
    assert "ignores HTTP range requests" in row["header"]["note"]
    text = run_cli("models", "search", "big-vocab", env=env).stdout
    assert "fit from the file size only (no KV cache counted): the server ignores HTTP range requests" in text
    assert hub.gets() == []


def test_pull_refuses_a_draft_with_another_tokenizer_before_any_download(env, hub, tmp_store):  # noqa: F811
    proc = run_cli("models", "pull", f"hf.co/{REPO_ID}", "--draft-model", "hf.co/other/gpt2-GGUF", env=env)
    assert proc.returncode == 1
    line = _error_line(proc.stderr)
    assert "hf.co/other/gpt2-GGUF cannot draft for hf.co/acme/big-vocab-GGUF" in line
    assert "tokenizer 'gpt2' differs from target 'llama'" in line and "nothing was downloaded" in line
    assert hub.gets() == [] and hub.header_reads()  # headers only
    big_reads = [r for r in hub.header_reads() if r.path.endswith(BIG)]
    assert 0 < hub.served(big_reads) < len(hub.files[(REPO_ID, BIG)]) // 10
    assert not list(tmp_store.glob("*/manifest.json"))


def test_pull_with_a_matching_draft_pulls_both_and_pairs_them(env, hub, tmp_store):  # noqa: F811
    proc = run_cli("models", "pull", f"hf.co/{REPO_ID}", "--draft-model", "hf.co/acme/draft-GGUF", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    start = next(ln for ln in lines if ln["event"] == "start" and ln["model"] == "acme-big-vocab-q4_k_m")
    assert "KV cache at n_ctx" in start["message"]  # the fit, stated before the download
    done = lines[-1]
    assert done["event"] == "installed" and done["pulled_draft"] == "acme-draft-q4_k_m"
    assert done["draft"]["draft"] == "acme-draft-q4_k_m" and "KV cache" in done["fit"]
    assert {Path(r.path).name for r in hub.gets()} == {BIG, "Draft-Q4_K_M.gguf"}
    # The draft's header, read for the tokenizer check, is not read again by the draft's own pull.
    draft_ranges = [r.headers["range"] for r in hub.header_reads() if r.path.endswith("Draft-Q4_K_M.gguf")]
    assert draft_ranges and len(draft_ranges) == len(set(draft_ranges))


def test_pull_without_a_draft_reads_only_what_the_fit_needs(env, hub, tmp_store):  # noqa: F811
    proc = run_cli("models", "pull", f"hf.co/{REPO_ID}", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "KV cache at n_ctx" in proc.stdout  # the fit from the header
    big_reads = [r for r in hub.header_reads() if r.path.endswith(BIG)]
    assert len(big_reads) == 1 and hub.served(big_reads) == FIRST_READ_BYTES  # not the ~250 KB of token texts


@pytest.mark.parametrize("name", ["Garbage-Q4_K_M.gguf", "Cut-Q8_0.gguf"])
def test_pull_of_a_file_that_is_not_a_gguf_is_one_line_before_download(env, hub, name):
    proc = run_cli("models", "pull", f"https://huggingface.co/acme/bad-GGUF/blob/main/{name}", env=env)
    assert proc.returncode == 1
    line = _error_line(proc.stderr)
    assert f"acme/bad-GGUF/{name} is not a GGUF model" in line and "nothing was downloaded" in line
    assert hub.gets() == []


def test_pull_without_range_support_goes_on_from_the_size_and_says_so(env, hub, tmp_store):  # noqa: F811
    hub.ignore_range = True
    proc = run_cli("models", "pull", "hf.co/acme/draft-GGUF", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "fit: " in proc.stdout and "from the file size only: the server ignores HTTP range requests" in proc.stdout
    assert len(hub.gets()) == 1


def test_real_model_header_by_ranges_matches_the_file_and_pairs(draft_path, target_path, tmp_path, monkeypatch):
    """The 0.5B's real header (151,936 tokens and their merges: ~6 MB) read by ranges from a fake
    Hub serving the file from disk: the same summary and tokens, a fraction of the file, and it
    drafts for the 1.5B by the same check that runs on installed files."""
    import mmap

    from huggingface_hub import constants

    h = FakeHub()
    with open(draft_path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        h.files[("qwen/coder-0.5b-GGUF", "c-q4_k_m.gguf")] = mm  # type: ignore[assignment]  # sliced lazily
        h.etag_override["c-q4_k_m.gguf"] = "0" * 64  # hashing 0.5 GB per request is not the point
        h.start()
        try:
            monkeypatch.setattr(constants, "ENDPOINT", h.url)
            monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                                h.url + "/{repo_id}/resolve/{revision}/{filename}")
            monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
            monkeypatch.delenv("HF_TOKEN", raising=False)
            got = read_remote_header("qwen/coder-0.5b-GGUF", "c-q4_k_m.gguf", "main", len(mm), depth=Depth.TOKENS)
        finally:
            h.stop()
        size = len(mm)
    assert got.outcome is Outcome.READ and got.meta is not None and got.info is not None, got.detail
    local = read_gguf_info(draft_path)
    assert (got.info.vocab_size, got.info.kv_bytes_per_token(), got.info.tokenizer_model) == (
        local.vocab_size, local.kv_bytes_per_token(), local.tokenizer_model)
    assert got.info.vocab_size and got.info.vocab_size > 150_000
    assert got.bytes_read == h.served(h.header_reads()) < size // 20
    c = check_draft_compat(target_path, got.meta)
    assert c.tokens_compared > 150_000


def test_without_ranges_a_mismatched_draft_is_refused_once_downloaded(env, hub, tmp_store):  # noqa: F811
    hub.ignore_range = True
    proc = run_cli("models", "pull", f"hf.co/{REPO_ID}", "--draft-model", "hf.co/other/gpt2-GGUF", env=env)
    assert proc.returncode == 1
    line = _error_line(proc.stderr)
    assert "hf.co/other/gpt2-GGUF (installed as other-gpt2-q4_k_m, as its header could not be read ahead)" in line
    assert "tokenizer 'gpt2' differs from target 'llama'" in line and "localspec models rm other-gpt2-q4_k_m" in proc.stderr
