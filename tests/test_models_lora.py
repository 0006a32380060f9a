"""LoRA adapters are checked before llama.cpp loads them: a GGUF adapter, for this model.

llama.cpp refuses most wrong adapters with a generic failure, and aborts the process on some
(a wrongly typed general.type or adapter.lora.alpha); check_lora names the reason first.
"""

from __future__ import annotations

import struct

import pytest
from tests.common import TARGET_ID
from gguf import GGUFValueType
from tests.gguf_factory import LLAMA_KV, crafted_gguf, g_kv, g_kv_str, g_kv_u32, g_nested_arrays, g_tensor, make_gguf, \
    make_lora_gguf
from tests.models_helpers import tmp_store  # noqa: F401

from localspec.errors import IncompatibleAdapterError, IntegrityError
from localspec.models import ModelManager, check_lora, read_gguf_info
from localspec.models.gguf_info import read_header

ADAPTER_KV = [g_kv_str("general.type", "adapter"), g_kv_str("adapter.type", "lora")]
F32 = 0


@pytest.fixture
def base(tmp_path):
    return make_gguf(tmp_path / "base.gguf", n_embd=16)  # blk.{0,1}.attn_q.weight are 16x16


def test_a_matching_adapter_passes(base, tmp_path):
    adapter = make_lora_gguf(tmp_path / "ok.gguf", targets={"blk.0.attn_q.weight": (16, 16),
                                                           "blk.1.attn_q.weight": (16, 16)}, rank=4, n_embd=16)
    compat = check_lora(adapter, base)
    assert (compat.architecture, compat.n_pairs, compat.ranks) == ("llama", 2, (4,))


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda p: make_gguf(p), "its general.type is None, not 'adapter'"),
        (lambda p: make_lora_gguf(p, general_type="model"), "its general.type is 'model', not 'adapter'"),
        (lambda p: make_lora_gguf(p, adapter_type="control_vector"), "its adapter.type is 'control_vector'"),
        (lambda p: make_lora_gguf(p, arch="qwen2"), "it is for architecture 'qwen2', the model base.gguf is 'llama'"),
        (lambda p: make_lora_gguf(p, n_embd=32), "its embedding size 32 differs from the model's 16"),
        (lambda p: make_lora_gguf(p, targets={"blk.0.attn_q.weight": (32, 32)}),
         "tensor 'blk.0.attn_q.weight' is 16x16 in the model base.gguf, but the adapter's pair is 32x2 and 2x32"),
        (lambda p: make_lora_gguf(p, transposed=True), "the adapter's pair is 2x16 and 2x16"),
        (lambda p: make_lora_gguf(p, targets={"blk.7.attn_q.weight": (16, 16)}),
         "the model base.gguf has no tensor 'blk.7.attn_q.weight'"),
        (lambda p: crafted_gguf(p, LLAMA_KV + ADAPTER_KV, [g_tensor("blk.0.attn_norm.weight", (16,))],
                                data=b"\0" * 64), "it has no lora_a/lora_b tensors"),
        (lambda p: crafted_gguf(p, LLAMA_KV + ADAPTER_KV, [g_tensor("blk.0.attn_q.weight.lora_a", (16, 2))],
                                data=b"\0" * 128), "the LoRA pair for 'blk.0.attn_q.weight' is missing one"),
        (lambda p: crafted_gguf(p, LLAMA_KV + ADAPTER_KV, [g_tensor("blk.0.attn_q.weight", (16, 16))],
                                data=b"\0" * 1024), "tensor 'blk.0.attn_q.weight' is neither a lora_a nor"),
    ],
    ids=["a-model", "general-type-model", "not-lora", "other-architecture", "other-embedding-size",
         "other-shape", "lora-a-not-transposed", "tensor-not-in-model", "no-lora-tensors", "half-pair",
         "foreign-tensor"],
)
def test_a_mismatched_adapter_is_refused_with_the_reason(base, tmp_path, make, reason):
    adapter = make(tmp_path / "adapter.gguf")
    with pytest.raises(IncompatibleAdapterError) as err:
        check_lora(adapter, base)
    assert reason in err.value.cause, err.value.cause
    assert str(adapter) in err.value.cause and err.value.fix and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("kvs", "reason"),
    [
        ([g_kv("x", int(GGUFValueType.ARRAY), g_nested_arrays(3000))] + ADAPTER_KV, "an array of arrays"),
        ([g_kv_u32("general.type", 1), g_kv_str("adapter.type", "lora")], "'general.type' must be a string"),
        (ADAPTER_KV + [g_kv("adapter.lora.alpha", int(GGUFValueType.UINT32), struct.pack("<I", 8))],
         "it is UINT32, not FLOAT32"),  # llama.cpp aborts the process on this one
    ],
    ids=["nested-arrays", "general-type-not-a-string", "alpha-not-float32"],
)
def test_a_malformed_adapter_is_an_integrity_error(base, tmp_path, kvs, reason):
    adapter = crafted_gguf(tmp_path / "bad.gguf", LLAMA_KV + kvs,
                           [g_tensor("blk.0.attn_q.weight.lora_a", (16, 2), F32, 0),
                            g_tensor("blk.0.attn_q.weight.lora_b", (2, 16), F32, 128)], data=b"\0" * 256)
    with pytest.raises(IntegrityError, match="not a valid GGUF file") as err:
        check_lora(adapter, base)
    assert reason in err.value.cause


def test_opening_an_engine_with_a_wrong_adapter_is_refused_before_llama_cpp(base, tmp_path, tmp_store):  # noqa: F811
    """The call site: open_engine checks settings' or the caller's lora_path against the target."""
    from localspec.service import open_engine

    ModelManager().import_file(base, model_id="tiny-base")
    wrong = make_lora_gguf(tmp_path / "wrong.gguf", targets={"blk.0.attn_q.weight": (32, 32)})
    with pytest.raises(IncompatibleAdapterError, match="adapter's pair is 32x2"):
        open_engine(target="tiny-base", mode="off", lora_path=str(wrong))
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("not an adapter")
    with pytest.raises(IntegrityError, match="not a valid GGUF file"):
        open_engine(target="tiny-base", mode="off", lora_path=str(not_gguf))


def _adapter_for(path, out, rank: int = 2):
    """A zero LoRA on the first layer's attention query of a real model, shaped from its header."""
    shape = next(t.shape for t in read_header(path).tensors if t.name == "blk.0.attn_q.weight")
    info = read_gguf_info(path)
    return make_lora_gguf(out, arch=info.architecture, targets={"blk.0.attn_q.weight": shape}, rank=rank)


def test_real_target_takes_its_adapter_and_refuses_the_drafts(target_path, draft_path, tmp_path):
    """check_lora's yes is llama.cpp's yes: the adapter it accepts loads on the real target."""
    from localspec.service import open_engine

    for_target = _adapter_for(target_path, tmp_path / "target-lora.gguf")
    for_draft = _adapter_for(draft_path, tmp_path / "draft-lora.gguf")
    assert check_lora(for_target, target_path).n_pairs == 1
    with pytest.raises(IncompatibleAdapterError, match="'blk.0.attn_q.weight' is 1536x1536 in the model"):
        check_lora(for_draft, target_path)
    with pytest.raises(IncompatibleAdapterError, match="'blk.0.attn_q.weight' is 1536x1536 in the model"):
        open_engine(target=TARGET_ID, mode="off", lora_path=str(for_draft), n_ctx=256, n_threads=2)
    engine = open_engine(target=TARGET_ID, mode="off", lora_path=str(for_target), n_ctx=256, n_threads=2)
    try:
        assert engine.target._lora  # llama.cpp attached it
    finally:
        engine.close()
