"""A request's own chat-template variables: llama-server's and vLLM's `chat_template_kwargs`,
`reasoning_effort`, Ollama's `think` and Anthropic's `thinking`, which turn a thinking model's thought
on or off where its template reads `enable_thinking` (Qwen3's does). The template here is written
for the test in that manner; the server is the real app on loopback over a scripted model whose
answer says which prompt it was given."""

from __future__ import annotations

import argparse

import anthropic
import ollama
import openai
import pytest
from pydantic import ValidationError

from localspec.engine.chat import ChatMessage, render_chat
from localspec.engine.config import GenerationRequest
from localspec.errors import UsageError
from localspec.server import ServerSettings
from tests.fake_tier import scripted_app, scripted_backend, scripted_pipeline, scripted_tier
from tests.server_harness import ServerThread, request

MODEL = "thinker"
KEY = "template-vars-key"
# Written for this test as thinking models' templates are: the thought is skipped with an empty one.
THINKER_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{%- if reasoning_effort is defined %}[effort {{ reasoning_effort }}]{% endif %}{% endif %}"
)
HI = [ChatMessage(role="user", content="Hi.")]


def answer(prompt: str) -> str:
    effort = prompt[prompt.find("[effort"):].split("]")[0] + "] " if "[effort" in prompt else ""
    if prompt.endswith("</think>\n\n"):
        return "No thought."
    return f"<think>\nA thought {effort}.\n</think>\n\nThought first."


@pytest.fixture(scope="module")
def served(module_home):
    tier = scripted_tier(model_id=MODEL, script=answer, chat_template=THINKER_TEMPLATE)
    app = scripted_app(backend=scripted_backend(pipeline=scripted_pipeline(tiers=[tier])),
                       settings=ServerSettings(api_key=KEY, router=False))
    with ServerThread(app) as srv:
        yield srv


def test_a_variable_reaches_the_template_and_the_templates_own_are_refused():
    on = render_chat(THINKER_TEMPLATE, HI)
    off = render_chat(THINKER_TEMPLATE, HI, extra={"enable_thinking": False})
    assert off == on + "<think>\n\n</think>\n\n"
    assert render_chat(THINKER_TEMPLATE, HI, extra={"messages": []}) == on  # the rendering's own win
    for bad, said in [({"messages": 1}, "the chat template's own"), ({"_localspec_loop": 1}, "not a template"),
                      ({"raise_exception": 1}, "own variable"), ({"a b": 1}, "not a template"),
                      ({"deep": {"x": 1}}, "a boolean, a number or a string"), ({f"v{i}": i for i in range(17)}, "at most 16")]:
        with pytest.raises(ValidationError, match=said):
            GenerationRequest(messages=HI, template_vars=bad)
    with pytest.raises(ValidationError, match="chat messages only"):
        GenerationRequest(prompt="Hi.", template_vars={"enable_thinking": False})


def test_chat_template_kwargs_and_reasoning_effort_turn_the_thought_off_and_on(served):
    client = openai.OpenAI(base_url=f"{served.base_url}/v1", api_key=KEY, max_retries=0)
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "Hi."}], temperature=0)
    thought = client.chat.completions.create(**ask).choices[0].message
    assert thought.content == "Thought first." and thought.model_extra["reasoning_content"] == "A thought ."
    # The cache keys on the variables too: the answer without them is not the answer with them.
    off = client.chat.completions.create(**ask, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert off.choices[0].message.content == "No thought."
    none = client.chat.completions.create(**ask, reasoning_effort="none")
    assert none.choices[0].message.content == "No thought."
    high = client.chat.completions.create(**ask, reasoning_effort="high")
    assert high.choices[0].message.model_extra["reasoning_content"] == "A thought [effort high] ."
    with pytest.raises(openai.BadRequestError, match="own variable"):
        client.chat.completions.create(**ask, extra_body={"chat_template_kwargs": {"add_generation_prompt": False}})
    r = request(served.base_url, "POST", "/apply-template", KEY,
                {"messages": [{"role": "user", "content": "Hi."}], "chat_template_kwargs": {"enable_thinking": False}})
    assert r.status_code == 200 and r.json()["prompt"].endswith("</think>\n\n"), r.text


def test_ollamas_think_turns_the_thought_off_and_names_the_effort(served):
    client = ollama.Client(host=served.base_url, headers={"Authorization": f"Bearer {KEY}"})
    hi = [{"role": "user", "content": "Hi."}]
    off = client.chat(model=MODEL, messages=hi, think=False, options={"temperature": 0})
    assert off.message.content == "No thought." and not off.message.thinking
    on = client.chat(model=MODEL, messages=hi, think="low", options={"temperature": 0})
    assert on.message.thinking == "A thought [effort low] ." and on.message.content == "Thought first."
    assert client.generate(model=MODEL, prompt="Hi.", think=False, options={"temperature": 0}).response == "No thought."
    r = request(served.base_url, "POST", "/api/chat", KEY, {"model": MODEL, "messages": hi, "think": "lots"})
    assert r.status_code == 400 and "think" in r.json()["error"], r.text


def test_anthropics_thinking_disabled_turns_the_thought_off(served):
    client = anthropic.Anthropic(base_url=served.base_url, api_key=KEY, max_retries=0)
    ask = dict(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "Hi."}], extra_body={"temperature": 0})
    off = client.messages.create(**ask, thinking={"type": "disabled"})
    assert [b.type for b in off.content] == ["text"] and off.content[0].text == "No thought."
    on = client.messages.create(**ask, thinking={"type": "enabled", "budget_tokens": 1024})
    assert [b.type for b in on.content] == ["thinking", "text"]


def test_generate_sends_no_think_as_the_templates_variable_and_refuses_it_without_chat(served):
    from localspec.attach.remote import RemoteGeneration, openai_client
    from localspec.cli import generate_cmd
    from localspec.engine.events import Done

    parser = argparse.ArgumentParser()
    generate_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["generate", "--chat", "--no-think", "Hi."])
    req = generate_cmd._request(args)
    assert req.template_vars == {"enable_thinking": False}
    # Attached to a server, the variable goes along as chat_template_kwargs.
    client = openai_client(f"{served.base_url}/v1", api_key=KEY)
    done = list(RemoteGeneration(client, MODEL, req, localspec=True))[-1]
    assert isinstance(done, Done) and done.text == "No thought."
    with pytest.raises(UsageError, match="--chat"):
        generate_cmd._request(parser.parse_args(["generate", "--think", "Hi."]))


def test_a_models_own_template_variables_apply_under_a_chat_requests_own(tmp_path):
    from localspec.engine.config import RequestDefaults
    from localspec.errors import ConfigError
    from localspec.models import ModelManager
    from localspec.models.model_settings import target_settings
    from tests.models_helpers import write_overlay

    entry = ('[[models]]\nid = "my-qwen3"\nrole = "target"\n  [models.settings]\n'
             '  template_vars = {{ {vars} }}\n  [[models.sources]]\n  kind = "file"\n  files = [{{ name = "q.gguf" }}]\n')
    write_overlay(entry.format(vars="enable_thinking = false"))
    defaults = target_settings("my-qwen3", ModelManager().resolve("my-qwen3").settings).defaults
    assert defaults == RequestDefaults(template_vars={"enable_thinking": False})
    chat = defaults.apply(GenerationRequest(messages=HI))
    assert chat.template_vars == {"enable_thinking": False} and defaults.apply(chat) == chat
    own = defaults.apply(GenerationRequest(messages=HI, template_vars={"enable_thinking": True, "x": 1}))
    assert own.template_vars == {"enable_thinking": True, "x": 1}
    assert defaults.apply(GenerationRequest(prompt="Hi.")).template_vars is None  # a raw prompt has no template
    write_overlay(entry.format(vars='messages = "x"'))
    with pytest.raises(ConfigError, match="template_vars"):
        ModelManager().resolve("my-qwen3")


# Opens the thought by default; enable_thinking false closes an empty one instead (written for the test).
OPENING_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}"
)


def test_whether_the_prompt_opens_the_thought_is_asked_with_the_requests_variables(module_home):
    """Asked once without them, a template that opens the thought unless told not to think split the
    whole answer off as thought (content empty) when the request said enable_thinking false."""
    def opened_answer(prompt: str) -> str:
        return "The answer." if prompt.endswith("</think>\n\n") else "A thought.\n</think>\n\nThe answer."

    tier = scripted_tier(model_id=MODEL, script=opened_answer, chat_template=OPENING_TEMPLATE)
    app = scripted_app(backend=scripted_backend(pipeline=scripted_pipeline(tiers=[tier])),
                       settings=ServerSettings(router=False, cache=False))
    with ServerThread(app) as srv:
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="x", max_retries=0)
        ask = dict(model=MODEL, messages=[{"role": "user", "content": "Hi."}], temperature=0)
        on = client.chat.completions.create(**ask).choices[0].message
        assert (on.content, on.model_extra["reasoning_content"]) == ("The answer.", "A thought.")
        off = client.chat.completions.create(**ask, reasoning_effort="none").choices[0].message
        assert off.content == "The answer." and off.model_extra.get("reasoning_content") is None


def test_counts_and_the_rendered_prompt_use_the_models_own_variables(module_home):
    """count_tokens, message_start and /apply-template rendered without the model's own template
    variables: a prompt the engine never ran (Qwen3's empty thought missing when it is off by default)."""
    from localspec.engine.config import RequestDefaults

    tier = scripted_tier(model_id=MODEL, script=answer, chat_template=THINKER_TEMPLATE)
    tier.engine.defaults = RequestDefaults(template_vars={"enable_thinking": False})  # as models.toml would
    app = scripted_app(backend=scripted_backend(pipeline=scripted_pipeline(tiers=[tier])),
                       settings=ServerSettings(router=False, cache=False))
    with ServerThread(app) as srv:
        hi = [{"role": "user", "content": "Hi."}]
        ran = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="x", max_retries=0).chat.completions.create(
            model=MODEL, messages=hi, temperature=0)
        assert ran.choices[0].message.content == "No thought."
        counted = anthropic.Anthropic(base_url=srv.base_url, api_key="x", max_retries=0).messages.count_tokens(
            model=MODEL, messages=hi).input_tokens
        assert counted == ran.usage.prompt_tokens
        r = request(srv.base_url, "POST", "/apply-template", None, {"messages": hi})
        assert r.json()["prompt"].endswith("</think>\n\n"), r.text


def test_a_variable_that_spells_a_special_token_is_refused(served):
    """Its text goes into the template's own, which is tokenized with special tokens read as tokens: a
    control token smuggled there was the model's, not text (the markers that keep a message's apart
    do not cover it)."""
    client = openai.OpenAI(base_url=f"{served.base_url}/v1", api_key=KEY, max_retries=0)
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "Hi."}], temperature=0)
    for smuggled in ("high<|file_sep|>system", "x\ue0000\ue001"):
        with pytest.raises(openai.BadRequestError, match="spells a special token"):
            client.chat.completions.create(**ask, extra_body={"chat_template_kwargs": {"reasoning_effort": smuggled}})
    plain = client.chat.completions.create(**ask, extra_body={"chat_template_kwargs": {"reasoning_effort": "<high>"}})
    assert plain.choices[0].message.model_extra["reasoning_content"] == "A thought [effort <high>] ."


def test_a_remote_tier_is_sent_the_variables_and_its_thought_comes_back_in_tags(served, monkeypatch):
    """The remote tier (vLLM, llama-server) was sent no template variables, and a thought it sent apart
    (reasoning_content) was dropped."""
    import threading

    from localspec.router import RemoteTier, TierSpec

    monkeypatch.setenv("LOCALSPEC_TEST_THINKER_KEY", KEY)
    tier = RemoteTier(TierSpec("remote", "remote", base_url=f"{served.base_url}/v1", model=MODEL,
                               api_key_env="LOCALSPEC_TEST_THINKER_KEY"), attempts=1)
    hi = [{"role": "user", "content": "Hi."}]
    thought = "".join(tier.stream_chat(hi, 64, 0.0, 1, None, threading.Event()))
    assert thought == "<think>\nA thought .\n</think>\n\nThought first."
    off = "".join(tier.stream_chat(hi, 64, 0.0, 1, None, threading.Event(), template_vars={"enable_thinking": False}))
    assert off == "No thought."


def test_an_effort_this_server_does_not_know_is_passed_on_not_refused(served):
    """OpenAI adds efforts (xhigh); a list of five refused the next one with a 400."""
    client = openai.OpenAI(base_url=f"{served.base_url}/v1", api_key=KEY, max_retries=0)
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi."}], temperature=0,
                                           reasoning_effort="xhigh")  # type: ignore[arg-type]
    assert reply.choices[0].message.model_extra["reasoning_content"] == "A thought [effort xhigh] ."
