"""A model's own settings ([models.settings] in the registry, like an Ollama Modelfile): parsing,
precedence (request > model settings > defaults), and that the engine and requests get them."""

from __future__ import annotations

import os

import pytest
from tests.fake_tier import ScriptedRuntime, echo, scripted, scripted_pipeline, scripted_tier
from tests.gguf_factory import make_gguf
from tests.models_helpers import tmp_store  # noqa: F401

from localspec.cache import SemanticCache
from localspec.engine.config import EngineConfig, GenerationRequest, RequestDefaults
from localspec.engine.events import Done
from localspec.engine.sampling import SamplingParams, with_fallbacks
from localspec.engine.scheduler import Engine
from localspec.engine.template_sandbox import MAX_TEMPLATE_CHARS
from localspec.errors import ConfigError
from localspec.models import ModelManager
from localspec.models.model_settings import MAX_TEMPLATE_BYTES, read_chat_template, target_settings
from localspec.models.registry import parse_registry_file

ENTRY = '''
[[models]]
id = "m"
role = "target"

  [models.settings]
'''


def _parse(tmp_path, settings: str):
    p = tmp_path / "models.toml"
    p.write_text(ENTRY + settings)
    return parse_registry_file(p).models[0].settings


# ---------------------------------------------------------------- parsing


def test_settings_parse(tmp_path):
    s = _parse(tmp_path, 'n_ctx = 8192\nchat_template = "tpl/chat.jinja"\nstop = ["</s>", "###"]\n'
                         "temperature = 0.3\ntop_p = 0.9\ntop_k = 40\nmin_p = 0.05\nrepeat_penalty = 1.1\n")
    assert s.n_ctx == 8192 and s.stop == ["</s>", "###"]
    assert s.chat_template == str(tmp_path / "tpl" / "chat.jinja")  # relative to the registry file
    assert s.sampling_values() == {"temperature": 0.3, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
                                   "repeat_penalty": 1.1}


def test_an_entry_without_settings_has_none(tmp_path):
    p = tmp_path / "models.toml"
    p.write_text(ENTRY.replace("  [models.settings]\n", ""))
    assert parse_registry_file(p).models[0].settings is None


@pytest.mark.parametrize(("line", "key"), [
    ("temperature = 9.0", "temperature"),
    ("top_p = 0.0", "top_p"),
    ("top_k = -1", "top_k"),
    ("repeat_penalty = 0", "repeat_penalty"),
    ("seed = -3", "seed"),
    ('temperature = "hot"', "temperature"),
    ("n_ctx = 10", "n_ctx"),
    ('stop = [""]', "stop"),
    ('chat_template = ""', "chat_template"),
    ("temprature = 0.2", "temprature"),  # a typo is refused, not ignored
])
def test_a_bad_value_names_the_entry_the_key_and_the_fix(tmp_path, line, key):
    with pytest.raises(ConfigError) as err:
        _parse(tmp_path, line + "\n")
    assert f"models[0].settings.{key} (model 'm')" in str(err.value)
    assert "\n" not in err.value.args[0]
    assert f"Correct models[0].settings.{key} (model 'm') in " in err.value.fix


def test_too_many_stops_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"settings\.stop \(model 'm'\)"):
        _parse(tmp_path, "stop = [" + ", ".join(f'"s{i}"' for i in range(17)) + "]\n")


# ---------------------------------------------------------------- the template file, untrusted


def test_template_file_read(tmp_path):
    p = tmp_path / "t.jinja"
    p.write_text("{{ messages }}", encoding="utf-8")
    assert read_chat_template(str(p), model_id="m") == "{{ messages }}"


@pytest.mark.parametrize(("make", "reason"), [
    (lambda p: None, "cannot open it"),
    (lambda p: p.mkdir(), "not a regular file"),
    (lambda p: os.mkfifo(p), "not a regular file"),  # must not block on a FIFO
    (lambda p: p.write_bytes(b"{{ x }}\xff\xfe"), "not UTF-8"),
    (lambda p: p.write_text("  \n"), "empty"),
    (lambda p: p.write_bytes(b"x" * (MAX_TEMPLATE_BYTES + 1)), "bytes (at most"),
    (lambda p: p.write_text("x" * (MAX_TEMPLATE_CHARS + 1)), "characters (at most"),
])
def test_an_unusable_template_file_is_one_line_naming_the_model_and_key(tmp_path, make, reason):
    p = tmp_path / "t.jinja"
    make(p)
    with pytest.raises(ConfigError) as err:
        read_chat_template(str(p), model_id="my-model")
    assert f"Model 'my-model': settings.chat_template {p}: " in str(err.value)
    assert reason in err.value.args[0] and "\n" not in err.value.args[0]
    assert "settings.chat_template" in err.value.fix


def test_target_settings_turn_into_engine_inputs(tmp_path):
    (tmp_path / "t.jinja").write_text("T:{{ messages[0]['content'] }}")
    s = _parse(tmp_path, 'n_ctx = 2048\nchat_template = "t.jinja"\nstop = ["END"]\ntop_k = 5\n')
    own = target_settings("m", s)
    assert own.n_ctx == 2048 and own.chat_template == "T:{{ messages[0]['content'] }}"
    assert own.defaults.stop == ["END"]
    assert own.defaults.sampling.model_fields_set == {"top_k"} and own.defaults.sampling.top_k == 5
    none = target_settings("m", None)
    assert none.n_ctx is None and none.chat_template is None and none.defaults == RequestDefaults()


# ---------------------------------------------------------------- precedence


DEFAULTS = RequestDefaults(sampling=SamplingParams(temperature=0.7, top_k=40), stop=["END"])


def test_model_defaults_fill_what_the_request_leaves_unset():
    out = DEFAULTS.apply(GenerationRequest(prompt="hi"))
    assert (out.sampling.temperature, out.sampling.top_k, out.sampling.top_p) == (0.7, 40, 1.0)
    assert out.stop == ["END"]


def test_request_values_beat_model_defaults():
    req = GenerationRequest(prompt="hi", sampling=SamplingParams(temperature=0.0, top_p=0.5), stop=["X"])
    out = DEFAULTS.apply(req)
    assert (out.sampling.temperature, out.sampling.top_k, out.sampling.top_p) == (0.0, 40, 0.5)
    assert out.stop == ["X"]


def test_applying_twice_changes_nothing_more():
    once = DEFAULTS.apply(GenerationRequest(prompt="hi", sampling=SamplingParams(top_p=0.5)))
    assert DEFAULTS.apply(once) == once


def test_face_fallbacks_sit_below_model_defaults():
    # The API's temperature 1.0 when the body omits it: the model's 0.7 still wins; a sent value beats both.
    omitted = with_fallbacks(SamplingParams(top_p=0.9), temperature=1.0)
    assert omitted.temperature == 1.0 and "temperature" not in omitted.model_fields_set
    assert DEFAULTS.apply(GenerationRequest(prompt="hi", sampling=omitted)).sampling.temperature == 0.7
    assert RequestDefaults().apply(GenerationRequest(prompt="hi", sampling=omitted)).sampling.temperature == 1.0
    sent = with_fallbacks(SamplingParams(temperature=0.2), temperature=1.0)
    assert DEFAULTS.apply(GenerationRequest(prompt="hi", sampling=sent)).sampling.temperature == 0.2


def test_the_endpoint_leaves_unsent_sampling_to_the_model():
    from localspec.server.schemas import ChatCompletionRequest
    from localspec.server.translate import _sampling

    body = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    req = GenerationRequest(prompt="hi", sampling=_sampling(body))
    assert req.sampling.temperature == 1.0  # OpenAI's default, when the model sets none
    assert DEFAULTS.apply(req).sampling.temperature == 0.7
    body = ChatCompletionRequest.model_validate({"model": "m", "temperature": 0.1,
                                                 "messages": [{"role": "user", "content": "hi"}]})
    assert DEFAULTS.apply(GenerationRequest(prompt="hi", sampling=_sampling(body))).sampling.temperature == 0.1


def test_attached_generate_leaves_an_unset_temperature_to_the_model_as_in_process():
    import argparse

    from localspec.attach.remote import RemoteGeneration
    from localspec.cli import generate_cmd
    from localspec.server.schemas import CompletionRequest
    from localspec.server.translate import _sampling

    parser = argparse.ArgumentParser()
    generate_cmd.register(parser.add_subparsers())

    def served(*flags: str, model: RequestDefaults) -> float:
        """The temperature a localspec server applies to what attached `generate` sends."""
        request = generate_cmd._request(parser.parse_args(["generate", "hi", *flags]))
        kwargs = RemoteGeneration(None, "m", request, localspec=True)._kwargs()
        extra = kwargs.pop("extra_body")
        body = CompletionRequest.model_validate({**kwargs, **extra, "prompt": "hi"})
        in_process = model.apply(request).sampling.temperature
        over_the_wire = model.apply(GenerationRequest(prompt="hi", sampling=_sampling(body))).sampling.temperature
        assert over_the_wire == in_process
        return over_the_wire

    assert served(model=DEFAULTS) == 0.7  # the model's own, not a 0.0 the user never gave
    assert served(model=RequestDefaults()) == 0.0  # greedy, as in-process, not OpenAI's 1.0
    assert served("--temperature", "0.2", model=DEFAULTS) == 0.2
    assert served("--temperature", "0", model=DEFAULTS) == 0.0
    # Another OpenAI-compatible server knows no model settings: it is told the face's value.
    plain = RemoteGeneration(None, "m", GenerationRequest(prompt="hi"))._kwargs()
    assert plain["temperature"] == 0.0


def test_generate_flags_left_out_leave_the_model_defaults():
    import argparse

    from localspec.cli import generate_cmd

    parser = argparse.ArgumentParser()
    generate_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["generate", "hi"])
    assert DEFAULTS.apply(generate_cmd._request(args)).sampling.temperature == 0.7
    args = parser.parse_args(["generate", "hi", "--temperature", "0"])
    assert DEFAULTS.apply(generate_cmd._request(args)).sampling.temperature == 0.0


# ---------------------------------------------------------------- the engine gets them


def _engine(script, **kw) -> Engine:
    return Engine(ScriptedRuntime(script), config=EngineConfig(n_ctx=1024, mode="off", pinned_prefix_cells=0), **kw)


def _answer(engine: Engine, request: GenerationRequest) -> str:
    done = [e for e in engine.generate(request) if isinstance(e, Done)]
    return done[0].text


def test_the_engine_applies_the_model_stop_unless_the_request_names_its_own():
    engine = _engine(scripted(default="alpha END beta"), defaults=RequestDefaults(stop=["END"]))
    try:
        assert _answer(engine, GenerationRequest(prompt="hi")) == "alpha "
        assert _answer(engine, GenerationRequest(prompt="hi", stop=["beta"])) == "alpha END "
    finally:
        engine.close()


def test_the_engine_renders_chats_with_the_model_template_file():
    chat = GenerationRequest(messages=[{"role": "user", "content": "hello"}])
    engine = _engine(echo(), chat_template="{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}")
    plain = _engine(echo())
    try:
        assert _answer(engine, chat) == "You said: <<hello>>"
        assert _answer(plain, chat) == "You said: hello"  # the GGUF's (ChatML) template
    finally:
        engine.close()
        plain.close()


def test_the_cache_key_sees_the_model_defaults():
    # The model samples by default: a request that sets no temperature is not a greedy one to cache.
    tier = scripted_tier()
    tier.engine.defaults = RequestDefaults(sampling=SamplingParams(temperature=0.8))
    plain = scripted_tier(name="small")
    pipe = scripted_pipeline(tiers=[plain, tier], cache=SemanticCache(embedder=None))
    try:
        request = GenerationRequest(prompt="hi")
        assert pipe.cache_key(request, tier)[1] == "sampled request (temperature > 0 and no seed)"
        assert pipe.cache_key(request, plain)[0] is not None
    finally:
        pipe.close()


# ---------------------------------------------------------------- open_engine takes them from the registry


def test_open_engine_takes_the_target_settings(tmp_path, tmp_store, monkeypatch):  # noqa: F811
    import localspec.service as service
    from tests.models_helpers import overlay_path

    base = make_gguf(tmp_path / "base.gguf")
    ModelManager().import_file(base, model_id="tiny-base")
    template = tmp_path / "chat.jinja"
    template.write_text("{{ messages[0]['content'] }}")
    with overlay_path().open("a") as f:
        f.write(f'\n  [models.settings]\n  n_ctx = 2048\n  chat_template = "{template}"\n  stop = ["END"]\n'
                "  temperature = 0.4\n")
    seen = {}

    def load(target, draft, config, **kw):
        seen.update(config=config, **kw)
        return "engine"

    monkeypatch.setattr(service.Engine, "load", load)
    assert service.open_engine(target="tiny-base", mode="off") == "engine"
    assert seen["config"].n_ctx == 2048
    assert seen["chat_template"] == "{{ messages[0]['content'] }}"
    assert seen["defaults"] == RequestDefaults(sampling=SamplingParams(temperature=0.4), stop=["END"])
    service.open_engine(target="tiny-base", mode="off", n_ctx=512)  # an explicit flag still wins
    assert seen["config"].n_ctx == 512


def test_model_n_ctx_sits_between_settings_toml_and_flags(monkeypatch):
    import localspec.service as service

    monkeypatch.setattr(service, "load_settings", lambda: {"n_ctx": 1024})
    assert service.engine_config(4096).n_ctx == 1024
    assert service.engine_config(4096, model_n_ctx=8192).n_ctx == 8192
    assert service.engine_config(4096, model_n_ctx=8192, n_ctx=256).n_ctx == 256


def test_a_template_file_changes_the_tier_cache_identity(tmp_path):
    from localspec.service import tier_fingerprint

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(64))
    own, a, b = _engine(echo()), _engine(echo(), chat_template="A{{ messages }}"), \
        _engine(echo(), chat_template="B{{ messages }}")
    try:
        prints = {tier_fingerprint(model, e) for e in (own, a, b)}
        assert len(prints) == 3  # cached answers of one template are not served under another
        assert tier_fingerprint(model, a) == tier_fingerprint(model, a)
    finally:
        for e in (own, a, b):
            e.close()
