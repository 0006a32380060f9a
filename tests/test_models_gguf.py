"""GGUF metadata, validation before llama.cpp, draft compatibility and the fit estimate."""

from __future__ import annotations

import json
import struct
import time

import pytest
from gguf import GGUFReader, TokenType
from tests.gguf_factory import BASE_TOKENS, make_gguf, n_params
from tests.models_helpers import run_cli

from localspec.errors import IncompatibleDraftError, IntegrityError
from localspec.models import check_draft_compat, estimate_fit, read_gguf_info, validate_gguf


@pytest.fixture
def tiny(tmp_path):
    return make_gguf(tmp_path / "tiny.gguf")


def test_info_of_tiny_model_matches_gguf_reader(tiny):
    info = read_gguf_info(tiny)
    assert info.architecture == "llama" and info.quant == "F32" and info.name == "tiny llama"
    assert info.parameters == n_params()
    assert (info.context_length, info.embedding_length, info.block_count) == (256, 16, 2)
    assert (info.head_count, info.head_count_kv, info.key_length, info.value_length) == (4, 2, 4, 4)
    assert info.vocab_size == len(BASE_TOKENS) and info.tokenizer_model == "llama"
    assert (info.bos_token_id, info.eos_token_id, info.has_chat_template) == (1, 2, True)
    # Cross-check against the reference reader on a file small enough for it to be quick.
    ref = GGUFReader(tiny)
    assert sum(int(t.n_elements) for t in ref.tensors) == info.parameters
    assert len(ref.fields["tokenizer.ggml.tokens"].data) == info.vocab_size
    assert info.kv_bytes_per_token() == 2 * 2 * (4 + 4) * 2  # layers * kv heads * (k+v dims) * f16


@pytest.mark.parametrize("case", ["zero", "tiny", "text", "version", "header-cut", "data-cut"])
def test_invalid_files_raise_integrity_error(tiny, tmp_path, case):
    data = tiny.read_bytes()
    bad = tmp_path / f"{case}.gguf"
    if case == "zero":
        bad.write_bytes(b"")
    elif case == "tiny":
        bad.write_bytes(data[:20])
    elif case == "text":
        bad.write_text("<html>404 Not Found</html>" * 4)
    elif case == "version":
        bad.write_bytes(data[:4] + struct.pack("<I", 7) + data[8:])
    elif case == "header-cut":
        bad.write_bytes(data[:200])
    else:  # the download stopped inside the tensor data
        bad.write_bytes(data[:-100])
    with pytest.raises(IntegrityError) as err:
        validate_gguf(bad)
    assert "not a valid GGUF file" in err.value.cause and str(bad) in err.value.cause
    assert "\n" not in str(err.value)


def test_truncation_reason_is_specific(tiny, tmp_path):
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(tiny.read_bytes()[:-100])
    with pytest.raises(IntegrityError, match="truncated download"):
        read_gguf_info(bad)
    with pytest.raises(IntegrityError, match="no such file"):
        validate_gguf(tmp_path / "missing.gguf")


def test_real_target_info_is_fast(target_path):
    start = time.perf_counter()
    info = read_gguf_info(target_path)
    assert time.perf_counter() - start < 2.0
    assert (info.architecture, info.quant, info.vocab_size) == ("qwen2", "Q4_K_M", 151936)
    assert info.tokenizer_model == "gpt2" and info.has_chat_template
    assert info.context_length == 32768 and info.block_count == 28 and info.head_count_kv == 2


def test_cli_info_on_target(target_path):
    proc = run_cli("models", "info", "qwen2.5-coder-1.5b-instruct-q4_k_m")
    assert proc.returncode == 0, proc.stderr
    for word in ("qwen2", "Q4_K_M", "151936", "chat template      yes"):
        assert word in proc.stdout
    proc = run_cli("models", "info", str(target_path), "--json")
    d = json.loads(proc.stdout)
    assert d["architecture"] == "qwen2" and d["quant"] == "Q4_K_M" and d["vocab_size"] == 151936


def test_cli_info_on_broken_file_is_one_line(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF")
    proc = run_cli("models", "info", str(bad))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr  # a runtime failure; 2 is for usage errors
    assert proc.stderr.startswith("error: ") and "not a valid GGUF file" in proc.stderr


def test_a_ggufs_text_reaches_the_terminal_without_its_escape_sequences(tmp_path, capsys):
    """A GGUF's name is its author's text: printed raw, it set the window title and cleared the screen."""
    from localspec.cli import main
    from tests.gguf_factory import make_gguf

    path = make_gguf(tmp_path / "esc.gguf", name="\x1b]0;PWNED\x07\x1b[31mRED", tokenizer="llama\x1b[2J")
    assert main(["models", "info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\ufffd]0;PWNED\ufffd\ufffd[31mRED" in out


def test_generate_shows_a_replys_escape_sequences_as_text_on_a_terminal(monkeypatch, capsys):
    import argparse
    import sys

    from localspec.cli.generate_cmd import _stream
    from localspec.engine.events import Done, Stats, Token

    events = [Token("a\x1b[2Jb\n\tc", (1,), "target"), Done("stop", Stats(mode="off"), "a\x1b[2Jb\n\tc")]
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    _stream(argparse.Namespace(json=False, show_draft=False), iter(events))
    assert capsys.readouterr().out == "a\ufffd[2Jb\n\tc"
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)  # piped: the text as it is
    _stream(argparse.Namespace(json=False, show_draft=False), iter(events))
    assert capsys.readouterr().out == "a\x1b[2Jb\n\tc"


@pytest.mark.parametrize("verb", [["models", "info"], ["models", "import"]])
def test_a_named_file_that_is_not_gguf_says_check_the_path(tmp_path, capsys, verb):
    from localspec.cli import main

    notes = tmp_path / "notes.txt"
    notes.write_text("root:x:0:0:root:/root:/bin/bash\n")
    assert main([*verb, str(notes)]) == 1
    err = capsys.readouterr().err
    assert err == (f"error: {notes} is not a valid GGUF file: bad magic b'root' (expected b'GGUF').\n"
                   "  fix: Check the path; it must be a GGUF file.\n")  # not "pull the model again"


# ---------------------------------------------------------------- draft compatibility


def test_real_pair_is_compatible(target_path, draft_path):
    start = time.perf_counter()
    compat = check_draft_compat(target_path, draft_path)
    assert time.perf_counter() - start < 5
    assert compat.target_n_vocab == compat.draft_n_vocab == 151936
    assert compat.tokenizer_model == "gpt2" and compat.vocab_padding == 0
    assert compat.tokens_compared > 150_000


def test_minilm_is_rejected_as_draft(target_path, minilm_path):
    with pytest.raises(IncompatibleDraftError) as err:
        check_draft_compat(target_path, minilm_path)
    assert err.value.cause == "draft tokenizer 'bert' differs from target 'gpt2'."


def test_small_vocab_difference_is_tolerated(tmp_path):
    target = make_gguf(tmp_path / "t.gguf", tokens=BASE_TOKENS + [f"<pad{i}>" for i in range(100)])
    draft = make_gguf(tmp_path / "d.gguf")
    compat = check_draft_compat(target, draft)
    assert (compat.target_n_vocab, compat.draft_n_vocab, compat.vocab_padding) == (164, 64, 100)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"tokenizer": "gpt2"}, "draft tokenizer 'gpt2' differs from target 'llama'"),
        ({"tokens": BASE_TOKENS + [f"x{i}" for i in range(200)]}, "draft vocabulary size 264 differs from target 64"),
        ({"bos": 3}, "draft BOS token id 3 differs from target 1"),
        ({"eos": 5}, "draft EOS token id 5 differs from target 2"),
        ({"tokens": BASE_TOKENS[:10] + ["other"] + BASE_TOKENS[11:]}, "draft token 10 'other' differs from target 'tok10'"),
    ],
)
def test_incompatible_drafts_name_the_property(tmp_path, change, reason):
    target = make_gguf(tmp_path / "t.gguf")
    draft = make_gguf(tmp_path / "d.gguf", **change)
    with pytest.raises(IncompatibleDraftError) as err:
        check_draft_compat(target, draft)
    assert reason in err.value.cause


def test_control_tokens_may_differ(tmp_path):
    target = make_gguf(tmp_path / "t.gguf")
    tokens = ["<unk>", "<|begin|>", "</s>"] + BASE_TOKENS[3:]
    types = [int(TokenType.CONTROL)] * 3 + [int(TokenType.NORMAL)] * (len(tokens) - 3)
    draft = make_gguf(tmp_path / "d.gguf", tokens=tokens, token_types=types)
    assert check_draft_compat(target, draft).tokens_compared == len(BASE_TOKENS) - 3


# ---------------------------------------------------------------- fit


def test_fit_estimate_verdicts(tiny):
    info = read_gguf_info(tiny)
    gib = 1 << 30
    roomy = estimate_fit(info, n_ctx=256, ram=16 * gib, vram=None)
    assert roomy.kv_bytes == 256 * info.kv_bytes_per_token()
    assert roomy.total_bytes == roomy.weights_bytes + roomy.kv_bytes + roomy.compute_bytes
    assert roomy.verdict == "fits in RAM"
    assert estimate_fit(info, n_ctx=256, ram=16 * gib, vram=8 * gib).verdict == "fits in VRAM"
    assert estimate_fit(info, n_ctx=256, ram=1024, vram=1024).verdict == "too large"


def test_fit_of_real_target(target_path):
    fit = estimate_fit(target_path, n_ctx=4096, ram=24 << 30, vram=None)
    # 28 layers * 2 kv heads * 128 dims * (k+v) * 2 bytes = 28 KiB per token.
    assert fit.kv_bytes == 4096 * 28 * 2 * 2 * 128 * 2
    assert fit.verdict == "fits in RAM"
