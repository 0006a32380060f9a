"""The OpenAI-compatible endpoint: a real server on loopback, the `openai` client.

One server for the module (parallel=4 slots, queue of 4, n_ctx=1024), loaded behind a gate so the
first test can see the loading state. It answers from a scripted model pair (tests/fake_tier.py)
under the target's names: the endpoint's control flow. What checks a real model's output (grammars,
tool calls, MiniLM's vectors) uses a second server with the real pair (`model_client`, stage 2).
"""

from __future__ import annotations

import json
import re
import threading
from collections import defaultdict

import numpy as np
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from localspec.engine.chat import ChatMessage
from localspec.server import ServerSettings, create_app
from tests.common import DRAFT_ID, EMBEDDING_ID, TARGET_ID, TEST_THREADS
from tests.fake_tier import Reply, ScriptedEmbedder, scripted_app, scripted_backend, scripted_pipeline, scripted_tier
from tests.server_harness import OpenStream, ServerThread, request, wait_until

KEY = "test-key-123"
PARALLEL = 4
QUEUE = 4
N_CTX = 1024
CAP = 512
SPEC = {"localspec": {"mode": "draft", "k": 4}}
SETTINGS = dict(
    api_key=KEY, parallel=PARALLEL, max_queue=QUEUE, n_ctx=N_CTX, n_threads=TEST_THREADS, mode="draft",
    max_tokens_cap=CAP, max_body_bytes=256 * 1024,
    cache=False, router=False,  # the engine path; the cache and router stages have modules of their own
)
REVERSE, PREFILL = "Write a Python function that reverses a string.", "```python\ndef reverse_string("
CONTINUATION = "s):\n    return s[::-1]\n```"
FIM = "<|fim_prefix|>def add(a, b):\n    return <|fim_suffix|>\n\n\nprint(add(2, 3))\n<|fim_middle|>"


def script(prompt: str) -> Reply | str:
    """The scripted target's answers: a word repeated, a story that streams for a while, a FIM middle."""
    if prompt == FIM:  # exactly the prompt the endpoint assembles from prompt and suffix
        return "a + b"
    if prompt.endswith(f"{REVERSE}<|im_end|>\n<|im_start|>assistant\n{PREFILL}"):  # the prefill, no turn of its own
        return Reply(CONTINUATION, pace_s=0.001)
    if word := re.search(r"Repeat this word exactly once and nothing else: (\w+)", prompt):
        return Reply(word.group(1), pace_s=0.01)  # paced: eight streams overlap in the engine's steps
    if "Look up two cities" in prompt:
        return "".join(f'<tool_call>\n{{"name": "weather", "arguments": {{"city": "{c}"}}}}\n</tool_call>\n'
                       for c in ("Paris", "Rome"))
    if "Write a long story" in prompt:
        return Reply("Once upon a time there was a robot. " * 60, pace_s=0.02)
    return "Red, green, blue. Yes."


@pytest.fixture(scope="module")
def server(module_home):
    gate = threading.Event()
    tier = scripted_tier(model_id=TARGET_ID, script=script, draft_script=script, mode="draft", parallel=PARALLEL,
                         n_ctx=N_CTX)
    backend = scripted_backend(pipeline=scripted_pipeline(tiers=[tier]), target_names=["qwen-coder-1.5b", "auto"],
                               embedder=ScriptedEmbedder(), embedding_id=EMBEDDING_ID)
    app = scripted_app(backend=backend, settings=ServerSettings(**SETTINGS), gate=gate)
    with ServerThread(app) as srv:
        srv.gate = gate
        yield srv
        gate.set()


@pytest.fixture(scope="module")
def ready(server):
    server.gate.set()
    assert wait_until(lambda: raw(server, "GET", "/health").status_code == 200, timeout=300), (
        raw(server, "GET", "/health").text
    )
    return server


@pytest.fixture
def client(ready) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{ready.base_url}/v1", api_key=KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def model_ready(target_path, draft_path, module_home):
    """The real model pair, for the tests that check what a model says."""
    app = create_app(ServerSettings(**SETTINGS))
    with ServerThread(app) as srv:
        assert wait_until(lambda: raw(srv, "GET", "/health").status_code == 200, timeout=300), (
            raw(srv, "GET", "/health").text
        )
        yield srv


@pytest.fixture
def model_client(model_ready) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{model_ready.base_url}/v1", api_key=KEY, max_retries=0, timeout=300)


def engine(srv):
    return srv.app.state.loader.backend.engine


def raw(srv, method: str, path: str, key: str | None = KEY, json=None):
    return request(srv.base_url, method, path, key, json)


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


# ---------------------------------------------------------------- loading


def test_health_is_503_while_loading_then_200(server):
    r = raw(server, "GET", "/health")
    assert r.status_code == 503 and r.json()["status"] == "loading"
    r = raw(server, "POST", "/v1/chat/completions", json={"model": TARGET_ID, "messages": user("hi")})
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "model_loading"
    assert "Retry-After" in r.headers
    server.gate.set()
    assert wait_until(lambda: raw(server, "GET", "/health").status_code == 200, timeout=300)
    assert raw(server, "GET", "/health").json()["status"] == "ok"


# ---------------------------------------------------------------- chat


def test_chat_streamed_text_equals_non_streamed(client):
    kw = dict(model=TARGET_ID, messages=user("Name three colours, comma separated."), max_tokens=16,
              temperature=0.8, seed=1234, extra_body=SPEC)
    full = client.chat.completions.create(**kw)
    text = full.choices[0].message.content
    assert text and full.choices[0].finish_reason in ("stop", "length")
    assert full.usage.completion_tokens > 0 and full.usage.prompt_tokens > 0
    ext = full.model_extra["localspec"]
    assert ext["mode"] == "draft" and ext["k"] == 4 and ext["drafted"] >= ext["accepted"]

    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].model_extra["localspec"]["mode"] == "draft"


def test_stream_has_no_usage_unless_asked(client):
    chunks = list(client.chat.completions.create(
        model=TARGET_ID, messages=user("Say hello."), max_tokens=8, temperature=0, stream=True
    ))
    assert chunks and all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_a_final_assistant_message_is_continued_whole_and_streamed(client):
    """A chat ending with the assistant's text was closed as a finished turn and answered anew. It is
    continued (as llama-server and Ollama do): the answer is the continuation, the prefill counted
    in the prompt and not repeated."""
    messages = [*user(REVERSE), {"role": "assistant", "content": PREFILL}]
    kw = dict(model=TARGET_ID, max_tokens=64, temperature=0, extra_body=SPEC)
    whole = client.chat.completions.create(messages=messages, **kw)
    assert whole.choices[0].message.content == CONTINUATION and whole.choices[0].finish_reason == "stop"
    plain = client.chat.completions.create(messages=user(REVERSE), **kw)
    assert whole.usage.prompt_tokens == plain.usage.prompt_tokens + len(PREFILL.encode())  # a byte a token
    assert whole.usage.completion_tokens == len(CONTINUATION.encode())
    chunks = list(client.chat.completions.create(messages=messages, stream=True, **kw))
    assert len(chunks) > 3 and "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == CONTINUATION


def test_chat_logprobs(client):
    r = client.chat.completions.create(
        model=TARGET_ID, messages=user("Say yes."), max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert "".join(t.token for t in content).startswith(r.choices[0].message.content)
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert t.top_logprobs[0].logprob == pytest.approx(t.logprob, abs=1e-6)


def test_json_schema_response_format(model_client):
    client = model_client
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "languages": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "age", "languages"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model=TARGET_ID, messages=user("Describe a programmer called Ada, 36, who knows Python and C."),
        max_tokens=80, temperature=0, extra_body=SPEC,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}},
    )
    obj = json.loads(r.choices[0].message.content)
    assert set(obj) == {"name", "age", "languages"}
    assert isinstance(obj["name"], str) and isinstance(obj["age"], int)
    assert all(isinstance(x, str) for x in obj["languages"])
    ext = r.model_extra["localspec"]
    assert ext["grammar"] == "enforced" and ext["mode"] == "draft" and ext["fallback"] is None


def test_json_object_sampled_falls_back_to_plain_decoding(model_client):
    client = model_client
    r = client.chat.completions.create(
        model=TARGET_ID, messages=user("Give a JSON object with a key 'ok' set to true."), max_tokens=40,
        temperature=0.7, seed=5, response_format={"type": "json_object"}, extra_body=SPEC,
    )
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    ext = r.model_extra["localspec"]
    assert ext["mode"] == "off" and ext["fallback"]


def test_tool_call_round_trip(model_client):
    client = model_client
    tools = [{
        "type": "function",
        "function": {
            "name": "get_weather", "description": "Current weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }]
    messages = user("What is the weather in Paris right now?")
    r = client.chat.completions.create(
        model=TARGET_ID, messages=messages, tools=tools, max_tokens=32, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert "paris" in json.loads(call.function.arguments)["city"].lower()
    # Streamed, a forced call is the call alone: its JSON is never sent as text.
    chunks = [c.choices[0] for c in client.chat.completions.create(
        model=TARGET_ID, messages=messages, tools=tools, max_tokens=32, temperature=0, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}) if c.choices]
    assert not "".join(c.delta.content or "" for c in chunks)
    assert [(d.function.name, d.function.arguments) for c in chunks for d in c.delta.tool_calls or []] == [
        (call.function.name, call.function.arguments)]

    messages = messages + [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"city": "Paris", "temperature_c": 18, "sky": "sunny"})},
    ]
    # The tool's answer goes back; tool_choice "none" asks for prose rather than another call.
    final = client.chat.completions.create(
        model=TARGET_ID, messages=messages, tools=tools, tool_choice="none", max_tokens=24, temperature=0
    )
    assert final.choices[0].finish_reason in ("stop", "length")
    content = final.choices[0].message.content
    assert content and ("18" in content or "sunny" in content.lower()), content


def test_prose_with_tools_offered_streams_as_the_whole_answer_says_it(model_client):
    """Tools offered (an agent's client offers them on every turn) and a question the model answers in
    prose: the text streams in pieces, and they make the greedy whole answer. Mode off on both: the
    check is the stream, not a near-tie that another batch shape may settle otherwise."""
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    ask = dict(model=TARGET_ID, messages=user("In two sentences, what is a hash map?"), tools=tools, max_tokens=40,
               temperature=0, extra_body={"localspec": {"mode": "off"}})
    whole = model_client.chat.completions.create(**ask).choices[0].message
    assert whole.content and not whole.tool_calls  # answered in prose
    pieces = [c.choices[0].delta.content for c in model_client.chat.completions.create(**ask, stream=True)
              if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 1 and "".join(pieces) == whole.content


def test_a_forced_call_with_a_text_format_too_is_the_call(model_client):
    """instructor's RESPONSES_TOOLS mode forces its one tool and sends the same schema as text.format, and a
    chat client may send a response_format beside a forced call. OpenAI answers with the call (the format
    shapes text, which a forced call does not write): here both were a 400."""
    user = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"], "additionalProperties": False}
    ask = [{"role": "user", "content": "Extract: John is 30 years old."}]
    r = model_client.responses.create(
        model=TARGET_ID, input=ask, max_output_tokens=48, temperature=0,
        text={"format": {"type": "json_schema", "name": "User", "strict": True, "schema": user}},
        tool_choice={"type": "function", "name": "User"}, tools=[{"type": "function", "name": "User", "parameters": user}])
    [call] = r.output
    assert call.type == "function_call" and call.name == "User" and set(json.loads(call.arguments)) == {"name", "age"}
    chat = model_client.chat.completions.create(
        model=TARGET_ID, messages=ask, max_tokens=48, temperature=0, tool_choice="required",
        response_format={"type": "json_schema", "json_schema": {"name": "User", "schema": user}},
        tools=[{"type": "function", "function": {"name": "User", "parameters": user}}])
    [tool_call] = chat.choices[0].message.tool_calls
    assert set(json.loads(tool_call.function.arguments)) == {"name", "age"}


def test_responses_api_round_trip_on_the_real_pair(model_client):
    """/v1/responses on the real model: a forced call's arguments, its output answered after
    previous_response_id, a schema kept through text.format, and a stream equal to the whole answer."""
    client = model_client
    tools = [{"type": "function", "name": "get_weather", "description": "Current weather for a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    r = client.responses.create(model=TARGET_ID, input="What is the weather in Paris right now?", tools=tools,
                                tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=32,
                                temperature=0)
    [call] = r.output
    assert call.type == "function_call" and "paris" in json.loads(call.arguments)["city"].lower()
    final = client.responses.create(
        model=TARGET_ID, previous_response_id=r.id, tools=tools, tool_choice="none", max_output_tokens=24,
        temperature=0, input=[{"type": "function_call_output", "call_id": call.call_id,
                               "output": json.dumps({"city": "Paris", "temperature_c": 18, "sky": "sunny"})}])
    assert "18" in final.output_text or "sunny" in final.output_text.lower(), final.output_text
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    person = client.responses.create(model=TARGET_ID, input="Invent a person.", max_output_tokens=40, temperature=0,
                                     text={"format": {"type": "json_schema", "name": "person", "schema": schema}})
    assert set(json.loads(person.output_text)) == {"name", "age"}
    assert person.model_extra["localspec"]["grammar"] == "enforced"
    ask = dict(model=TARGET_ID, input="Name three sorting algorithms.", max_output_tokens=24, temperature=0)
    with client.responses.stream(**ask) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
    assert "".join(deltas) == client.responses.create(**ask).output_text  # greedy: the same answer


def test_ollama_api_on_the_real_pair(model_ready, target_path):
    """The official `ollama` client on the real model: a schema kept through format, and a stream
    equal to the whole answer (greedy)."""
    import ollama

    client = ollama.Client(host=model_ready.base_url, headers={"Authorization": f"Bearer {KEY}"}, timeout=300)
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    person = client.chat(model=TARGET_ID, messages=[{"role": "user", "content": "Invent a person."}], format=schema,
                         options={"temperature": 0, "num_predict": 40})
    assert set(json.loads(person.message.content)) == {"name", "age"}
    ask = dict(model=TARGET_ID, messages=[{"role": "user", "content": "Name three sorting algorithms."}],
               options={"temperature": 0, "num_predict": 24})
    streamed = "".join(p.message.content for p in client.chat(**ask, stream=True))
    assert streamed == client.chat(**ask).message.content
    shown = client.show(TARGET_ID)
    assert "insert" in shown.capabilities  # Qwen2.5-Coder has the FIM tokens suffix needs
    assert (shown.details.family, shown.details.parameter_size, shown.details.quantization_level) == (
        "qwen2", "1.5B", "Q4_K_M")  # from its GGUF: Open WebUI shows them beside the name
    listed = {m.model: m for m in client.list().models}[TARGET_ID + ":latest"]
    assert listed.size == target_path.stat().st_size and len(listed.digest) == 64


def test_stop_string_inside_an_accepted_draft_run_on_the_real_pair(model_client):
    """The real pair copying a sentence: the draft model's runs are accepted whole, and a stop string
    ends the reply inside one (and inside an emoji's tokens). Each mode gives mode off's text, streamed
    the same, its logprobs' bytes the reply's, the stop string's tokens in neither."""
    quote = "The quick brown fox jumps over the lazy dog. 🎉 Pack my box with five dozen liquor jugs."
    ask = dict(model=TARGET_ID, messages=user(f"Repeat this text exactly, nothing else:\n{quote}"), max_tokens=40,
               temperature=0, logprobs=True, stop=["🎉 Pack", "five"])
    replies = {}
    for mode in ("off", "draft", "lookup"):
        spec = {"localspec": {"mode": mode, "k": 8}}
        whole = model_client.chat.completions.create(**ask, extra_body=spec)
        choice = whole.choices[0]
        chunks = [c.choices[0] for c in model_client.chat.completions.create(**ask, extra_body=spec, stream=True)
                  if c.choices]
        streamed = [t for c in chunks if c.logprobs for t in c.logprobs.content]
        assert "".join(c.delta.content or "" for c in chunks) == choice.message.content, mode
        assert [c.finish_reason for c in chunks if c.finish_reason] == [choice.finish_reason] == ["stop"], mode
        lp_bytes = bytes(b for t in choice.logprobs.content for b in t.bytes)
        assert lp_bytes == bytes(b for t in streamed for b in t.bytes), mode
        lp_text = lp_bytes.decode(errors="replace")  # may end inside the emoji: its first token held the space
        assert lp_text.startswith(choice.message.content) and "🎉" not in lp_text, (mode, lp_text)
        replies[mode] = choice.message.content
    assert replies["off"].endswith("lazy dog. ") and set(replies.values()) == {replies["off"]}, replies


def test_a_prefill_is_continued_by_the_real_pair_and_every_mode_says_what_off_says(model_client):
    """Greedy with an assistant prefill: the 1.5B continues the signature it was given (a new answer
    opens with ``` or def), and each speculative mode's text is mode off's, streamed
    the same."""
    ask = dict(model=TARGET_ID, max_tokens=32, temperature=0,
               messages=[*user(REVERSE), {"role": "assistant", "content": PREFILL}])
    replies = {}
    for mode in ("off", "auto", "lookup", "draft"):
        r = model_client.chat.completions.create(**ask, extra_body={"localspec": {"mode": mode}})
        replies[mode] = r.choices[0].message.content
    off = replies["off"]
    signature = off.split("\n", 1)[0]  # the parameters, closed: "s: str) -> str:"
    assert not off.lstrip().startswith(("```", "def")) and ")" in signature and signature.endswith(":"), off
    assert set(replies.values()) == {off}, replies
    chunks = model_client.chat.completions.create(**ask, stream=True, extra_body={"localspec": {"mode": "draft"}})
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == off


# ---------------------------------------------------------------- completions, FIM, models, embeddings


def test_completion_text_offsets_count_through_the_stream_and_the_echo(client):
    """Every streamed chunk's text_offset started at 0, and echo's ignored the echoed prompt."""
    prompt = "Say red green blue."
    for echo in (False, True):
        whole = client.completions.create(model=TARGET_ID, prompt=prompt, max_tokens=12, temperature=0, logprobs=1,
                                          echo=echo)
        lp = whole.choices[0].logprobs
        start = len(prompt) if echo else 0
        assert lp.text_offset[0] == start and whole.choices[0].text[start:].startswith("".join(lp.tokens))
        assert lp.text_offset == [start + len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
        streamed = [c.choices[0].logprobs for c in client.completions.create(
            model=TARGET_ID, prompt=prompt, max_tokens=12, temperature=0, logprobs=1, echo=echo, stream=True)
            if c.choices and c.choices[0].logprobs]
        assert len(streamed) > 1 and [o for c in streamed for o in c.text_offset] == lp.text_offset, echo


def test_completion_with_logprobs(client):
    r = client.completions.create(model=TARGET_ID, prompt="def fibonacci(n):", max_tokens=16, temperature=0, logprobs=2)
    text = r.choices[0].text
    assert text and r.usage.completion_tokens == len(r.choices[0].logprobs.tokens)
    assert "".join(r.choices[0].logprobs.tokens).startswith(text)
    stream = list(client.completions.create(model=TARGET_ID, prompt="def fibonacci(n):", max_tokens=16, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    # Not compared with `text`: the second run reuses the cached prompt, and batch shape may flip near-ties.
    streamed = "".join(c.choices[0].text for c in stream if c.choices)
    assert streamed and stream[-1].usage.completion_tokens > 0
    assert [c.choices[0].finish_reason for c in stream if c.choices][-1] in ("stop", "length")


def test_fill_in_the_middle(client):
    r = client.completions.create(
        model="qwen-coder-1.5b",  # an alias
        prompt="def add(a, b):\n    return ",
        suffix="\n\n\nprint(add(2, 3))\n",
        max_tokens=16, temperature=0, extra_body={"localspec": {"mode": "lookup"}},
    )
    middle = r.choices[0].text
    assert "a + b" in middle or "a+b" in middle
    assert "print(add" not in middle  # the middle, not the suffix again
    assert r.model_extra["localspec"]["mode"] == "lookup"


def test_fill_in_the_middle_reads_code_that_spells_a_marker_as_text(model_client, model_ready):
    """Code that spells `<|fim_middle|>` was read as the marker, which ended the prefix mid-code: the
    prompt had one marker token more than its three. Now it counts the code's own tokens."""
    prefix, suffix = 'MARK = "<|fim_middle|>"\ndef add(a, b):\n    return ', "\n\nprint(add(2, 3))\n"
    rt = engine(model_ready).target
    as_text = sum(len(rt.tokenize(t, add_special=False, parse_special=False)) for t in (prefix, suffix))
    r = model_client.completions.create(model=TARGET_ID, prompt=prefix, suffix=suffix, max_tokens=8, temperature=0,
                                        extra_body={"localspec": {"cache": False}})
    assert r.usage.prompt_tokens == as_text + 3  # the three markers, and the code as text
    body = {"input_prefix": 'MARK = "<|fim_middle|>"\n', "prompt": "def add(a, b):\n    return ",
            "input_suffix": suffix, "n_predict": 4, "temperature": 0}
    infill = raw(model_ready, "POST", "/infill", json=body).json()
    names = sum(len(rt.tokenize(t, add_special=False, parse_special=False)) for t in ("myproject\n", "filename\n"))
    assert infill["tokens_evaluated"] == as_text + 3 + 2 + names  # <|repo_name|>myproject\n<|file_sep|>filename\n
    assert "<|fim_middle|>" not in infill["content"]


def test_models_lists_ids_aliases_and_auto(client):
    ids = {m.id for m in client.models.list().data}
    assert {TARGET_ID, "qwen-coder-1.5b", "auto", "all-minilm-l6-v2-f16"} <= ids
    assert DRAFT_ID not in ids  # the draft is not a chat model of its own here


def test_embeddings_base64_and_float(model_client, model_ready, minilm_path):
    client, ready = model_client, model_ready
    r = client.embeddings.create(model="all-minilm-l6-v2-f16", input=["a red apple", "a green apple", "tax law"])
    vecs = [np.array(d.embedding) for d in r.data]  # the client asked for base64 and decoded it
    assert len(vecs) == 3 and vecs[0].shape == (384,)
    assert all(abs(np.linalg.norm(v) - 1) < 1e-3 for v in vecs)
    assert vecs[0] @ vecs[1] > vecs[0] @ vecs[2]
    f = raw(ready, "POST", "/v1/embeddings", json={"model": "all-minilm-l6-v2-f16", "input": "a red apple", "encoding_format": "float"})
    assert f.status_code == 200
    assert np.allclose(np.array(f.json()["data"][0]["embedding"]), vecs[0], atol=1e-5)
    assert r.usage.prompt_tokens > 0


def test_ollamas_embed_cuts_a_long_text_to_the_window_unless_told_not_to(model_ready, embedder):
    """/api/embed refused a text past MiniLM's 512 tokens (400) while Ollama's truncate, true by default,
    cuts it to fit: Open WebUI's long chunks failed. truncate: false keeps the 400, as /v1/embeddings."""
    long_text = "The quick brown fox jumps over the lazy dog near the riverbank. " * 80  # about 1,100 tokens
    head = embedder.truncated(long_text)
    assert long_text.startswith(head) and embedder.count_tokens(head) <= embedder.window
    assert embedder.count_tokens(head) > embedder.window - 16  # the window, nearly full
    body = {"model": "all-minilm-l6-v2-f16", "input": [long_text, "a red apple"]}
    r = raw(model_ready, "POST", "/api/embed", json=body)
    assert r.status_code == 200, r.text
    cut, short = (np.array(v) for v in r.json()["embeddings"])
    assert np.allclose(cut, embedder.embed(head), atol=1e-4) and np.allclose(short, embedder.embed("a red apple"), atol=1e-4)
    assert r.json()["prompt_eval_count"] == embedder.count_tokens(head) + embedder.count_tokens("a red apple")
    refused = raw(model_ready, "POST", "/api/embed", json=body | {"truncate": False})
    assert refused.status_code == 400 and "takes at most 512" in refused.json()["error"], refused.text
    openai_way = raw(model_ready, "POST", "/v1/embeddings", json=body)
    assert openai_way.status_code == 400, openai_way.text


# ---------------------------------------------------------------- concurrency


def test_eight_concurrent_streams_complete_and_share_steps(client, ready):
    words = ["apple", "banana", "cherry", "dragon", "eagle", "falcon", "guitar", "harbor"]
    results: dict[str, tuple[str, str | None, int | None]] = {}
    errors: list[BaseException] = []

    def run(word: str) -> None:
        try:
            text, reason, n = "", None, None
            for c in client.chat.completions.create(
                model=TARGET_ID, messages=user(f"Repeat this word exactly once and nothing else: {word}"),
                max_tokens=12, temperature=0, stream=True, stream_options={"include_usage": True},
            ):
                if c.choices:
                    text += c.choices[0].delta.content or ""
                    reason = c.choices[0].finish_reason or reason
                if c.usage:
                    n = c.usage.completion_tokens
            results[word] = (text, reason, n)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in words]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    assert set(results) == set(words)
    for word, (text, reason, n) in results.items():
        assert word in text.lower(), (word, text)
        assert reason in ("stop", "length") and n and n > 0
    assert engine(ready).max_step_sequences > 1


def _open_streams(srv, n: int, max_tokens: int) -> list[OpenStream]:
    """n streaming requests, held open (their handlers have submitted once the headers arrive)."""
    streams = []
    for i in range(n):
        body = {"model": TARGET_ID, "messages": user(f"Write a long story about robot number {i}."),
                "max_tokens": max_tokens, "temperature": 0, "stream": True}
        s = OpenStream(srv.base_url, "/v1/chat/completions", KEY, body)
        assert s.status_code == 200
        streams.append(s)
    return streams


def test_disconnect_frees_the_slot_and_the_next_request_takes_it(ready):
    eng = engine(ready)
    assert wait_until(lambda: all(s.active is None for s in eng.slots))
    (stream,) = _open_streams(ready, 1, 400)
    seen = 0
    for line in stream.lines():
        if line.startswith("data: ") and '"content"' in line:
            seen += 1
            if seen >= 3:
                break
    assert any(s.active is not None for s in eng.slots)
    stream.close()
    assert wait_until(lambda: all(s.active is None for s in eng.slots), timeout=60)
    # The same prompt again lands in the freed slot, reusing the KV it left behind.
    r = raw(ready, "POST", "/v1/chat/completions", json={
        "model": TARGET_ID, "messages": user("Write a long story about robot number 0."), "max_tokens": 4, "temperature": 0,
    })
    assert r.status_code == 200
    assert r.json()["localspec"]["reused_prefix_tokens"] > 0


def test_queue_full_gives_429_with_retry_after(ready):
    eng = engine(ready)
    assert wait_until(lambda: all(s.active is None for s in eng.slots))
    streams = _open_streams(ready, PARALLEL + QUEUE, 200)
    try:
        r = raw(ready, "POST", "/v1/chat/completions", json={"model": TARGET_ID, "messages": user("hi"), "max_tokens": 4})
        assert r.status_code == 429
        assert r.json()["error"]["type"] == "rate_limit_error" and int(r.headers["Retry-After"]) >= 1
        c = openai.OpenAI(base_url=f"{ready.base_url}/v1", api_key=KEY, max_retries=0)
        with pytest.raises(openai.RateLimitError):
            c.chat.completions.create(model=TARGET_ID, messages=user("hi"), max_tokens=4)
    finally:
        for stream in streams:
            stream.close()
    assert wait_until(lambda: all(s.active is None for s in eng.slots) and not eng._pending, timeout=120)


# ---------------------------------------------------------------- errors, auth, metrics, spec


@pytest.mark.parametrize(
    "body, status, code",
    [
        ({"messages": user("hi"), "temperature": 9}, 400, "invalid_value"),
        # n choices are served up to --parallel (one slot each): beyond it, and below 1, a 400 naming n
        ({"messages": user("hi"), "n": PARALLEL + 1}, 400, "invalid_value"),
        ({"messages": user("hi"), "n": 0}, 400, "invalid_value"),
        ({"messages": []}, 400, "invalid_value"),
        ({"messages": user("hi"), "max_tokens": CAP + 1}, 400, "invalid_value"),
        ({"messages": user("hi"), "model": "gpt-4o"}, 404, "model_not_found"),
        ({"messages": user("word " * 1500)}, 400, "context_length_exceeded"),
        # Accepted and ignored before: each changes the answer a client expects
        ({"messages": user("hi"), "logit_bias": {"9707": -100}}, 400, "unsupported_value"),
        ({"messages": user("hi"), "tool_choice": "required"}, 400, "invalid_value"),
        ({"messages": user("hi"), "tool_choice": {"type": "function", "function": {"name": "f"}}, "tools": []}, 400,
         "invalid_value"),
        ({"messages": user("hi"), "top_logprobs": 3}, 400, "invalid_value"),
    ],
)
def test_error_status_and_type(ready, body, status, code):
    r = raw(ready, "POST", "/v1/chat/completions", json={"model": TARGET_ID, **body})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["type"] == "invalid_request_error" and err["message"]
    if code == "context_length_exceeded":
        assert str(N_CTX) in err["message"] and "prompt_tokens=" in err["message"]
        assert "--n-ctx" in err["message"]  # the fix, as the endpoint's errors promise
    if body.get("max_tokens") == CAP + 1:
        assert f"at most {CAP}" in err["message"] and "--max-tokens-cap" in err["message"]
    if body.get("n") == PARALLEL + 1:  # the cause and the fix: the slots, and the flag that sets them
        assert err["param"] == "n" and f"--parallel {PARALLEL}" in err["message"]
        assert f"at most {PARALLEL}" in err["message"] and "larger --parallel" in err["message"]


def test_best_of_other_than_one_is_refused_and_an_empty_logit_bias_passes(ready):
    body = {"model": TARGET_ID, "prompt": "Say hi", "max_tokens": 4}
    r = raw(ready, "POST", "/v1/completions", json=body | {"best_of": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "best_of", r.text
    for ok in ({"best_of": 1}, {"logit_bias": {}}, {"logit_bias": None}):
        assert raw(ready, "POST", "/v1/completions", json=body | ok).status_code == 200, ok


def test_parallel_tool_calls_false_returns_the_first_call_only(client):
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    for stream in (False, True):
        calls = {}
        for parallel in (None, False):
            extra = {} if parallel is None else {"parallel_tool_calls": parallel}
            r = client.chat.completions.create(model=TARGET_ID, messages=user("Look up two cities."), tools=tools,
                                               max_tokens=256, temperature=0, stream=stream, **extra)
            if stream:
                deltas = [d for chunk in r if chunk.choices for d in chunk.choices[0].delta.tool_calls or []]
                calls[parallel] = [json.loads(d.function.arguments)["city"] for d in deltas]
            else:
                calls[parallel] = [json.loads(c.function.arguments)["city"] for c in r.choices[0].message.tool_calls]
        assert calls == {None: ["Paris", "Rome"], False: ["Paris"]}, (stream, calls)


def test_openai_client_error_classes(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=user("hi"))
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=TARGET_ID, messages=user("hi"), n=PARALLEL + 1)
    bad = openai.OpenAI(base_url=client.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_auth_and_body_limit(ready):
    assert raw(ready, "GET", "/v1/models", key=None).status_code == 401
    r = raw(ready, "GET", "/v1/models", key="wrong")
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert raw(ready, "GET", "/health", key=None).status_code == 200  # health stays open
    big = {"model": TARGET_ID, "messages": user("x" * 300_000)}
    r = raw(ready, "POST", "/v1/chat/completions", json=big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    assert "--max-body-mb" in r.json()["error"]["message"]


def test_metrics_parse(ready, client):
    client.chat.completions.create(model=TARGET_ID, messages=user("Say hi."), max_tokens=6, temperature=0, extra_body=SPEC)
    ready.app.state.metrics.flush()
    r = raw(ready, "GET", "/metrics")
    assert r.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    for name in ("localspec_requests", "localspec_time_to_first_token_seconds", "localspec_inter_token_latency_seconds",
                 "localspec_request_duration_seconds", "localspec_queue_depth", "localspec_spec_drafted_tokens",
                 "localspec_spec_accepted_tokens", "localspec_spec_accepted_by_position"):
        assert name in families, sorted(families)
    api = [s for s in families["localspec_requests"].samples if s.labels.get("face") == "api" and s.name.endswith("_total")]
    assert sum(s.value for s in api) >= 1


def test_openapi_documents_errors_and_stream(ready):
    spec = raw(ready, "GET", "/openapi.json", key=None).json()
    chat = spec["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert {"200", "400", "401", "404", "413", "429", "503"} <= set(chat)
    assert "text/event-stream" in chat["200"]["content"]


def test_llamacpp_infill_with_the_real_model_fills_the_middle(model_ready):
    """llama.vscode's /infill with Qwen2.5-Coder: the repo-level layout (its vocabulary has <|repo_name|> and
    <|file_sep|>), the middle and not the suffix again."""
    body = {"input_prefix": "def add(a, b):\n", "prompt": "    return ", "input_suffix": "\n\n\nprint(add(2, 3))\n",
            "input_extra": [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}],
            "n_predict": 12, "temperature": 0, "n_indent": 4, "t_max_predict_ms": 500, "cache_prompt": True,
            "samplers": ["top_k", "top_p", "infill"], "id_slot": 0}
    r = raw(model_ready, "POST", "/infill", json=body)
    assert r.status_code == 200, r.text
    middle = r.json()["content"]
    assert "a + b" in middle or "a+b" in middle
    assert "print(add" not in middle
    assert r.json()["tokens_evaluated"] > 20 and r.json()["timings"]["predicted_n"] > 0


def test_llamacpp_tokenize_matches_the_models_tokenizer(model_ready):
    text = "def héllo(world):\n    return '<|fim_prefix|>'"
    r = raw(model_ready, "POST", "/tokenize", json={"content": text, "add_special": False, "parse_special": True})
    expected = engine(model_ready).target.tokenize(text, add_special=False, parse_special=True)
    assert r.status_code == 200 and r.json()["tokens"] == expected
    fim = engine(model_ready).target.tokenize("<|fim_prefix|>", add_special=False, parse_special=True)
    assert len(fim) == 1 and fim[0] in expected  # parse_special: the marker is one token
    pieces = raw(model_ready, "POST", "/tokenize", json={"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == expected
    assert raw(model_ready, "POST", "/detokenize", json={"tokens": expected}).json()["content"] == text


def test_llamacpp_completion_streamed_is_the_whole_answer_when_greedy(model_ready):
    body = {"prompt": "def fibonacci(n):\n", "n_predict": 16, "temperature": 0}
    whole = raw(model_ready, "POST", "/completion", json=body).json()
    r = raw(model_ready, "POST", "/completion", json={**body, "stream": True})
    lines = [json.loads(line.removeprefix("data: ")) for line in r.text.split("\n\n") if line.startswith("data: ")]
    assert whole["content"] and lines[-1]["stop"] is True
    assert "".join(line["content"] for line in lines) == whole["content"]
    assert lines[-1]["tokens_predicted"] == whole["tokens_predicted"]


def test_llamacpp_a_stop_string_the_real_model_reaches_is_stop_type_word(model_ready):
    """A greedy function body reaches a newline: the answer is its first line, `stop_type` "word" and
    `stopping_word` the newline, whole and on the stream's last line (the server drafts: the newline may
    come inside an accepted draft run)."""
    body = {"prompt": "def fibonacci(n):\n", "n_predict": 32, "temperature": 0, "stop": ["\n"]}
    whole = raw(model_ready, "POST", "/completion", json=body).json()
    assert whole["stop_type"] == "word" and whole["stopping_word"] == "\n", whole
    assert whole["content"].strip() and "\n" not in whole["content"]
    r = raw(model_ready, "POST", "/completion", json={**body, "stream": True})
    lines = [json.loads(line.removeprefix("data: ")) for line in r.text.split("\n\n") if line.startswith("data: ")]
    assert "".join(line["content"] for line in lines) == whole["content"]
    assert lines[-1]["stop_type"] == "word" and lines[-1]["stopping_word"] == "\n"


def test_llamacpp_apply_template_is_the_prompt_a_chat_request_decodes_from(model_ready):
    """Qwen2.5-Coder's own template (its default system turn included), the assistant's turn opened: the very
    tokens the engine decodes a chat of the same messages from. Behind the API key, in llama-server's shape."""
    messages = [{"role": "user", "content": "Write hello world in C."}]
    r = raw(model_ready, "POST", "/apply-template", json={"messages": messages})
    assert r.status_code == 200, r.text
    prompt = r.json()["prompt"]
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    assert "<|im_start|>user\nWrite hello world in C.<|im_end|>\n" in prompt
    eng = engine(model_ready)
    chat = eng.prompter.render([ChatMessage(role="user", content="Write hello world in C.")])
    assert eng.target.tokenize(prompt, add_special=True, parse_special=True) == chat
    r = raw(model_ready, "POST", "/apply-template", key=None, json={"messages": messages})
    assert r.status_code == 401
    assert r.json()["error"]["code"] == 401 and r.json()["error"]["type"] == "authentication_error"


def test_llamacpp_grammar_and_json_schema_constrain_the_real_models_answer(model_ready):
    """llama-server's `json_schema` and `grammar` on /completion (and /infill); a GBNF llama.cpp cannot parse
    is a 400 naming `grammar`, and the server answers the next request."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    body = {"prompt": "A JSON object with the number of legs of a spider:\n", "n_predict": 48, "temperature": 0}
    r = raw(model_ready, "POST", "/completion", json={**body, "json_schema": schema})
    assert r.status_code == 200, r.text
    assert isinstance(json.loads(r.json()["content"])["n"], int) and r.json()["stop_type"] == "eos"
    yes_no = {"prompt": "Is Python a programming language? Answer yes or no.\nAnswer: ", "n_predict": 8,
              "temperature": 0, "grammar": 'root ::= "yes" | "no"'}
    r = raw(model_ready, "POST", "/completion", json=yes_no)
    assert r.status_code == 200 and r.json()["content"] in ("yes", "no"), r.text
    fim = {"input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n", "n_predict": 8, "temperature": 0,
           "grammar": 'root ::= "a + b" | "b - a"'}
    r = raw(model_ready, "POST", "/infill", json=fim)
    assert r.status_code == 200 and r.json()["content"] in ("a + b", "b - a"), r.text
    r = raw(model_ready, "POST", "/completion", json={**yes_no, "grammar": 'root ::= "yes'})
    error = r.json()["error"]
    assert r.status_code == 400 and error["code"] == 400 and error["type"] == "invalid_request_error"
    assert error["message"].startswith("grammar: ") and "Fix:" in error["message"]
    assert raw(model_ready, "POST", "/completion", json=yes_no).status_code == 200


def test_n_choices_with_the_real_model(model_client):
    """n=3 sampled with a seed: three indexed, different answers, the prompt counted once; greedy choices
    are all the n=1 answer; streamed choices, reassembled by index, are the whole ones. (That choice i
    is exactly seed + i's draw is checked on the scripted model, whose logits are exact: a real model's
    batched kernels differ in the last bits with what decodes beside it, so a sampled near-tie can go
    either way from run to run.)"""
    sampled = dict(model=TARGET_ID, messages=user("Write one line of a poem about the sea."), max_tokens=16,
                   temperature=0.8, seed=42, extra_body=SPEC)
    three = model_client.chat.completions.create(n=3, **sampled)
    texts = [c.message.content for c in three.choices]
    assert [c.index for c in three.choices] == [0, 1, 2] and len(set(texts)) == 3, texts
    assert three.usage.prompt_tokens == three.model_extra["localspec"]["prompt_tokens"]  # the prompt once
    assert len(three.model_extra["localspec"]["choices"]) == 3
    greedy = dict(model=TARGET_ID, messages=user("Name a prime number."), max_tokens=12, temperature=0, extra_body=SPEC)
    one = model_client.chat.completions.create(**greedy).choices[0].message.content
    two = model_client.chat.completions.create(n=2, **greedy)
    assert [c.message.content for c in two.choices] == [one, one] and one
    streamed: defaultdict[int, str] = defaultdict(str)
    for chunk in model_client.chat.completions.create(n=2, stream=True, **greedy):
        for c in chunk.choices:
            streamed[c.index] += c.delta.content or ""
    assert dict(streamed) == {0: one, 1: one}
