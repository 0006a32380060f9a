"""LoRA adapters are checked before llama.cpp loads them: a GGUF adapter, for this model.

llama.cpp refuses most wrong adapters with a generic failure, and aborts the process on some
(a wrongly typed general.type or adapter.lora.alpha); check_lora names the reason first.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest
from tests.common import TARGET_ID
from gguf import GGUFValueType
from tests.gguf_factory import LLAMA_KV, crafted_gguf, g_kv, g_kv_str, g_kv_u32, g_nested_arrays, g_tensor, make_gguf, \
    make_lora_gguf, synthetic_lora
from tests.models_helpers import tmp_store  # noqa: F401

from localspec.errors import IncompatibleAdapterError, IntegrityError, UsageError
from localspec.models import ModelManager, check_lora, read_gguf_info
from localspec.models.adapters import LoraSpec, parse_lora_spec
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


def test_an_adapter_that_is_not_gguf_says_check_its_path_not_pull_again(base, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    with pytest.raises(IntegrityError, match="not a valid GGUF file") as err:
        check_lora(notes, base)
    assert err.value.fix == ("Check the adapter's path (--lora, or `lora =` in models.toml); it must be a LoRA "
                             "adapter GGUF.")


def test_a_path_with_a_nul_byte_is_refused_not_raised(base):
    """lora_path from settings.toml is not parsed as a flag: check_lora refuses it in one line."""
    with pytest.raises(IncompatibleAdapterError, match="NUL byte"):
        check_lora("style\0.gguf", base)


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


# ---------------------------------------------------------------- --lora PATH[:SCALE]


@pytest.mark.parametrize(
    ("text", "path", "scale"),
    [
        ("style.gguf", "style.gguf", 1.0),
        ("style.gguf:0.5", "style.gguf", 0.5),
        ("dir/style.gguf:-1", "dir/style.gguf", -1.0),
        ("C:\\adapters\\style.gguf", "C:\\adapters\\style.gguf", 1.0),  # a colon that is the path's own
        ("a:b.gguf:2", "a:b.gguf", 2.0),
    ],
)
def test_lora_flag_is_a_path_and_an_optional_scale(text, path, scale):
    assert parse_lora_spec(text) == LoraSpec(Path(path), scale)


def test_an_existing_file_whose_name_ends_in_a_number_is_a_path(tmp_path):
    odd = tmp_path / "adapter:2"
    odd.write_bytes(b"")
    assert parse_lora_spec(str(odd)) == LoraSpec(odd, 1.0)


@pytest.mark.parametrize(("text", "why"), [("", "no path"), (":0.5", "no path before the scale"),
                                           ("a.gguf:nan", "not a finite number"), ("a.gguf:inf", "not a finite"),
                                           ("a\0b.gguf", "NUL byte")])
def test_a_malformed_lora_flag_is_a_usage_error(text, why):
    with pytest.raises(UsageError, match=why):
        parse_lora_spec(text)


def test_the_lora_flag_is_checked_before_anything_loads(capsys):
    from localspec.cli import main

    assert main(["generate", "--lora", "a.gguf:inf", "--no-pull", "hello"]) == 2
    assert main(["serve", "--lora", ":1", "--no-pull"]) == 2
    assert "Invalid --lora" in capsys.readouterr().err


def test_serve_carries_the_adapter_and_its_scale_into_its_settings():
    from localspec.cli import build_parser
    from localspec.cli.serve_cmd import settings_from_args

    s = settings_from_args(build_parser().parse_args(["serve", "--lora", "style.gguf:0.25"]))
    assert (s.lora_path, s.lora_scale) == ("style.gguf", 0.25)
    assert settings_from_args(build_parser().parse_args(["serve"])).lora_path is None


def test_chat_with_an_adapter_loads_here_and_refuses_connect():
    """A server has its own models: --lora is a reason not to attach, and cannot go with --connect."""
    from localspec.cli import build_parser
    from localspec.cli.chat_cmd import _blockers, chat_lora

    args = build_parser().parse_args(["chat", "--lora", "style.gguf:0.5"])
    assert chat_lora(args) == LoraSpec(Path("style.gguf"), 0.5) and _blockers(args)
    assert _blockers(build_parser().parse_args(["chat"])) == []
    with pytest.raises(UsageError, match="--connect uses a server's models"):
        chat_lora(build_parser().parse_args(["chat", "--connect", "http://127.0.0.1:9/v1", "--lora", "a.gguf"]))


def test_an_adapters_answers_are_cached_apart_from_the_bare_models(base, tmp_path):
    """The cache is keyed by whose answers they are: the adapter and its scale are part of it."""
    from localspec.engine.embedder import file_fingerprint
    from localspec.service import answer_fingerprint

    one = make_lora_gguf(tmp_path / "one.gguf", rank=2)
    two = make_lora_gguf(tmp_path / "two.gguf", rank=4)
    bare = answer_fingerprint(base, None, 1.0)
    keys = {bare, answer_fingerprint(base, str(one), 1.0), answer_fingerprint(base, str(one), 0.5),
            answer_fingerprint(base, str(two), 1.0)}
    assert bare == file_fingerprint(base) and len(keys) == 4


def test_v1_models_names_the_adapter_on_the_targets_names_only(tmp_path):
    """/v1/models shows the served target's adapter by file name and scale, never its full path."""
    from localspec.server import ServerSettings
    from tests.fake_tier import scripted_app, scripted_backend, scripted_pipeline, scripted_tier
    from tests.server_harness import ServerThread, request

    adapter = LoraSpec(tmp_path / "private" / "style.gguf", 0.5)
    backend = scripted_backend(pipeline=scripted_pipeline(tiers=[scripted_tier(model_id="scripted-large")]),
                               routes={"auto": "auto"}, adapter=adapter)
    settings = ServerSettings(cache=False, router=False)
    with ServerThread(scripted_app(backend=backend, settings=settings)) as srv:
        reply = request(srv.base_url, "GET", "/v1/models")
    cards = {m["id"]: m["localspec"] for m in reply.json()["data"]}
    assert cards["scripted-large"]["adapter"] == "style.gguf:0.5"
    assert cards["auto"]["adapter"] is None  # the router may answer with another tier, the bare model
    assert str(tmp_path) not in reply.text


def test_the_scale_reaches_the_targets_runtime():
    from localspec.engine.config import EngineConfig
    from localspec.engine.loading import runtime_config

    rc = runtime_config(EngineConfig(lora_path="style.gguf", lora_scale=0.25))
    assert (rc.lora_path, rc.lora_scale) == ("style.gguf", 0.25)


# ---------------------------------------------------------------- a real adapter on the 0.5B

# Answers longer than max_tokens: an answer that ends inside it may end one token earlier or later
# on a near-tie at its end-of-text, which assert_same_or_near_tie does not prove.
LORA_PROMPTS = ["Write a Python function that checks whether a number is prime.",
                "Write a JavaScript function that debounces another function."]


def test_speculation_stays_lossless_with_an_adapter_on_the_target(draft_path, tmp_path):
    """The 0.5B with a synthetic adapter is the target, the bare 0.5B its draft: greedy draft-mode
    output equals the adapted target alone (up to a proven near-tie), and differs from the bare
    model's, so the adapter is applied; the draft, which lacks it, loses acceptance."""
    from localspec.engine.config import EngineConfig
    from localspec.engine.scheduler import Engine
    from tests.common import TEST_THREADS
    from tests.test_engine_real import assert_same_or_near_tie, chat, run

    adapter = synthetic_lora(draft_path, tmp_path / "synthetic.gguf")
    assert check_lora(adapter, draft_path).n_pairs == 48
    config = EngineConfig(n_ctx=512, n_threads=TEST_THREADS, mode="off")  # "off": no calibration at load
    requests = [chat(p, max_tokens=24) for p in LORA_PROMPTS]
    bare = Engine.load(str(draft_path), None, config)
    try:
        bare_ids = [run(bare, r)[0] for r in requests]
    finally:
        bare.close()
    adapted = Engine.load(str(draft_path), str(draft_path), config.model_copy(update={"lora_path": str(adapter)}))
    accepted = drafted = 0
    try:
        for request, plain in zip(requests, bare_ids, strict=True):
            alone, _, _ = run(adapted, request)
            speculative, done, _ = run(adapted, request.model_copy(update={"mode": "draft"}))
            assert alone != plain, "the adapter did not change the greedy answer"
            prompt_ids, _ = adapted.prompt_tokens(request)
            assert_same_or_near_tie(adapted, prompt_ids, alone, speculative, f"draft on {request.messages[0].content!r}")
            accepted, drafted = accepted + done.stats.accepted, drafted + done.stats.drafted
    finally:
        adapted.close()
    assert 0 < accepted < drafted, (accepted, drafted)  # the bare draft no longer always agrees


def test_generate_refuses_an_adapter_for_another_base_in_one_line(target_path, draft_path, tmp_path, capsys):
    """The 1.5B's adapter on the 0.5B: the CLI names the tensor that does not fit (llama.cpp, loading
    it, would say only that it failed)."""
    from localspec.cli import main
    from tests.common import DRAFT_ID

    for_target = synthetic_lora(target_path, tmp_path / "for-1.5b.gguf")
    argv = ["generate", "--local", "--no-pull", "--model", DRAFT_ID, "--mode", "off", "--lora", f"{for_target}:0.5"]
    assert main([*argv, "hello"]) == 1
    cause, fix = capsys.readouterr().err.strip().splitlines()  # the CLI's two lines: error, then fix
    assert "tensor 'blk.0.attn_q.weight' is 896x896 in the model" in cause and "1536x8 and 8x1536" in cause, cause
    assert fix.strip().startswith("fix:") and "--lora" in fix, fix


# ---------------------------------------------------------------- an adapter bound in models.toml


def _bind(text: str) -> None:
    """Bind an adapter to the imported tiny-base in the user's models.toml (its entry's `lora`)."""
    from localspec.paths import resolve_paths

    overlay = resolve_paths().user_registry
    entry = re.sub(r'(?m)^lora = .*\n', "", overlay.read_text())  # the one bound before, if any
    assert 'id = "tiny-base"\n' in entry
    overlay.write_text(entry.replace('id = "tiny-base"\n', f'id = "tiny-base"\nlora = "{text}"\n'))


def test_an_adapter_bound_in_models_toml_is_listed_and_applied(base, tmp_path, tmp_store, capsys):  # noqa: F811
    import json

    from localspec.cli import main
    from localspec.service import open_engine

    ModelManager().import_file(base, model_id="tiny-base")
    wrong = make_lora_gguf(tmp_path / "wrong.gguf", targets={"blk.0.attn_q.weight": (32, 32)})
    _bind(f"{wrong}:0.5")
    assert ModelManager().lora("tiny-base") == LoraSpec(wrong, 0.5)
    assert main(["models", "list", "--no-fit", "--json"]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["tiny-base"]["lora"] == f"{wrong}:0.5" and rows[TARGET_ID]["lora"] is None
    assert main(["models", "list", "--no-fit"]) == 0
    assert "wrong.gguf:0.5" in capsys.readouterr().out.replace("\n", "")
    with pytest.raises(IncompatibleAdapterError, match="wrong.gguf cannot be used"):  # applied without --lora
        open_engine(target="tiny-base", mode="off")


def test_a_bound_adapters_relative_path_is_in_the_models_store_dir(base, tmp_store):  # noqa: F811
    from localspec.errors import ConfigError

    ModelManager().import_file(base, model_id="tiny-base")
    _bind("style.gguf")
    mm = ModelManager()
    assert mm.lora("tiny-base") == LoraSpec(mm.store.model_dir("tiny-base") / "style.gguf", 1.0)
    _bind("style.gguf:nan")
    with pytest.raises(ConfigError, match="tiny-base.lora"):
        ModelManager().lora("tiny-base")


def test_serve_refuses_a_wrong_adapter_before_it_starts(base, tmp_path, tmp_store, capsys):  # noqa: F811
    from localspec.cli import main

    ModelManager().import_file(base, model_id="tiny-base")
    wrong = make_lora_gguf(tmp_path / "wrong.gguf", arch="qwen2")
    assert main(["serve", "--no-pull", "--port", "0", "--model", "tiny-base", "--lora", str(wrong)]) == 1
    out = capsys.readouterr()
    assert "it is for architecture 'qwen2', the model base.gguf is 'llama'" in out.err and "serving" not in out.out
