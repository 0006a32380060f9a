"""A thinking model's thought apart from its answer, on every chat face: OpenAI's reasoning_content,
the Responses API's reasoning item, Anthropic's thinking block, Ollama's thinking; whole and streamed alike, tool calls read in the
content only, and an answer with no thought exactly as it was.

A real server on loopback and each API's official client, over scripted targets (tests/fake_tier.py)
whose answer to "Answer NAME." is ANSWERS[NAME]: one with ChatML (the answer opens its own thought
with <think>), one whose generation prompt ends with <think>\\n, as DeepSeek-R1-Distill's does (the
answer holds only </think>). No real thinking model is run here.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import anthropic
import httpx
import ollama
import openai
import pytest

from localspec.server import ServerSettings
from localspec.server.routes.plans import with_thinking
from localspec.server.schemas import ChatCompletionRequest
from localspec.server.translate import chat_plan
from tests.fake_tier import scripted_app, scripted_backend, scripted_pipeline, scripted_tier
from tests.common import CHAT_TOOLS, MESSAGES_TOOLS, RESPONSES_TOOLS
from tests.server_harness import ServerThread

KEY = "thinking-key"
MODEL = "scripted-thinker"
# DeepSeek-R1-Distill's shape: the generation prompt opens the thought.
OPENING = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
           "{% if add_generation_prompt %}<|assistant|><think>\n{% endif %}")


def call(city: str) -> str:
    return f'<tool_call>\n{{"name": "weather", "arguments": {{"city": "{city}"}}}}\n</tool_call>'


Calls = list[tuple[str, dict]]
# name: (answer, opened, (the thought, the content, the calls) a client reads)
ANSWERS: dict[str, tuple[str, bool, tuple[str | None, str, Calls]]] = {
    "thought": ("<think>\nThe user asks for a capital.\n</think>\n\nParis.", False,
                ("The user asks for a capital.", "Paris.", [])),
    "thought-then-call": (f"<think>\nI need the weather.\n</think>\n\n{call('Paris')}", False,
                          ("I need the weather.", "", [("weather", {"city": "Paris"})])),
    "thought-mentions-a-call": (f"<think>\nI could write {call('Oslo')} but no.\n</think>\n\nSunny.", False,
                                (f"I could write {call('Oslo')} but no.", "Sunny.", [])),
    "cut-off-thought": ("<think>\nStill thinking about </thi", False, ("Still thinking about </thi", "", [])),
    "multi-byte": ("<think>Café ☕ </think> Ok ☕", False, ("Café ☕", "Ok ☕", [])),
    "plain": ("  Paris is the capital of France.", False, (None, "  Paris is the capital of France.", [])),
    "not-a-thought": ("<thinking> is no tag.", False, (None, "<thinking> is no tag.", [])),
    "opened": ("Okay, a capital.\n</think>\n\nParis.", True, ("Okay, a capital.", "Paris.", [])),
    "opened-then-call": (f"Checking.\n</think>\n\n{call('Rome')}", True,
                         ("Checking.", "", [("weather", {"city": "Rome"})])),
}


def script(prompt: str) -> str:
    for name, (answer, _, _) in ANSWERS.items():
        if f"Answer {name}." in prompt:
            return answer
    return "OK."


def _served(template: str | None):
    tier = scripted_tier(model_id=MODEL, script=script, chat_template=template)
    app = scripted_app(backend=scripted_backend(pipeline=scripted_pipeline(tiers=[tier])),
                       settings=ServerSettings(api_key=KEY, cache=False, router=False, max_tokens_cap=512))
    return ServerThread(app)


@pytest.fixture(scope="module")
def servers(module_home):
    with _served(None) as closed, _served(OPENING) as opened:
        yield {False: closed, True: opened}


def _openai(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key=KEY, max_retries=0, timeout=120)


def chat(srv, question: str, *, stream: bool, **extra) -> tuple[str | None, str, Calls]:
    ask = dict(model=MODEL, messages=[{"role": "user", "content": question}], temperature=0, tools=CHAT_TOOLS)
    if not stream:
        message = _openai(srv).chat.completions.create(**ask, extra_body=extra).choices[0].message
        return (getattr(message, "reasoning_content", None), message.content or "",
                [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []])
    thought, text, named, args = None, "", {}, {}
    for chunk in _openai(srv).chat.completions.create(**ask, stream=True, extra_body=extra):
        delta = chunk.choices[0].delta
        if (more := getattr(delta, "reasoning_content", None)) is not None:
            thought = (thought or "") + more
        text += delta.content or ""
        for d in delta.tool_calls or []:
            named[d.index] = named.get(d.index) or d.function.name
            args[d.index] = args.get(d.index, "") + (d.function.arguments or "")
    return thought, text, [(named[i], json.loads(args[i])) for i in sorted(named)]


def responses(srv, question: str, *, stream: bool) -> tuple[str | None, str, Calls]:
    ask = dict(model=MODEL, input=question, temperature=0, tools=RESPONSES_TOOLS)
    if not stream:
        output = _openai(srv).responses.create(**ask).output
        kinds = [o.type for o in output]
        assert kinds == sorted(kinds, key=["reasoning", "message", "function_call"].index)  # the thought first
        thoughts = [c.text for o in output if o.type == "reasoning" for c in o.content]
        return (thoughts[0] if thoughts else None,
                "".join(p.text for o in output if o.type == "message" for p in o.content),
                [(o.name, json.loads(o.arguments)) for o in output if o.type == "function_call"])
    thought, text, calls = None, "", []
    for e in _openai(srv).responses.create(**ask, stream=True):
        if e.type == "response.reasoning_text.delta":
            thought = (thought or "") + e.delta
        elif e.type == "response.output_text.delta":
            text += e.delta
        elif e.type == "response.output_item.done" and e.item.type == "function_call":
            calls.append((e.item.name, json.loads(e.item.arguments)))
    return thought, text, calls


def messages(srv, question: str, *, stream: bool) -> tuple[str | None, str, Calls]:
    client = anthropic.Anthropic(base_url=srv.base_url, api_key=KEY, max_retries=0, timeout=120)
    ask = dict(model=MODEL, max_tokens=256, messages=[{"role": "user", "content": question}], tools=MESSAGES_TOOLS,
               extra_body={"temperature": 0})
    if stream:  # the SDK's own accumulator over the events
        with client.messages.stream(**ask) as events:
            content = events.get_final_message().content
    else:
        content = client.messages.create(**ask).content
    kinds = [b.type for b in content]
    assert kinds == sorted(kinds, key=["thinking", "text", "tool_use"].index)  # the thought first, then the text
    thoughts = [b.thinking for b in content if b.type == "thinking"]
    assert all(b.signature == "" for b in content if b.type == "thinking")
    return (thoughts[0] if thoughts else None, "".join(b.text for b in content if b.type == "text"),
            [(b.name, b.input) for b in content if b.type == "tool_use"])


def ollama_chat(srv, question: str, *, stream: bool) -> tuple[str | None, str, Calls]:
    client = ollama.Client(host=srv.base_url, timeout=120, headers={"Authorization": f"Bearer {KEY}"})
    ask = dict(model=MODEL, messages=[{"role": "user", "content": question}], tools=CHAT_TOOLS,
               options={"temperature": 0})
    parts = list(client.chat(**ask, stream=True)) if stream else [client.chat(**ask, stream=False)]
    thoughts = [p.message.thinking for p in parts if p.message.thinking]
    return ("".join(thoughts) if thoughts else None, "".join(p.message.content or "" for p in parts),
            [(c.function.name, dict(c.function.arguments)) for p in parts for c in p.message.tool_calls or []])


def ollama_generate(srv, question: str, *, stream: bool) -> tuple[str | None, str, Calls]:
    client = ollama.Client(host=srv.base_url, timeout=120, headers={"Authorization": f"Bearer {KEY}"})
    parts = (list(client.generate(model=MODEL, prompt=question, stream=True)) if stream
             else [client.generate(model=MODEL, prompt=question, stream=False)])
    thoughts = [p.thinking for p in parts if p.thinking]
    return "".join(thoughts) if thoughts else None, "".join(p.response for p in parts), []


FACES = {"chat": chat, "responses": responses, "messages": messages, "ollama": ollama_chat}


def _expected(face, name: str) -> tuple[str | None, str, Calls]:
    thought, content, calls = ANSWERS[name][2]
    if face in (messages, responses) and not thought:  # no thinking block for an empty thought; text blocks are not padded
        return None, content, calls
    return thought, content, calls


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("name", ANSWERS)
def test_the_thought_comes_apart_from_the_content_whole_and_streamed(servers, face, name):
    srv = servers[ANSWERS[name][1]]
    ask = FACES[face]
    whole = ask(srv, f"Answer {name}.", stream=False)
    assert whole == _expected(ask, name)
    assert ask(srv, f"Answer {name}.", stream=True) == whole


@pytest.mark.parametrize("name", ["thought", "opened", "plain", "cut-off-thought"])
def test_ollama_generate_returns_the_thought_apart(servers, name):
    srv = servers[ANSWERS[name][1]]
    thought, content, _ = ANSWERS[name][2]
    whole = ollama_generate(srv, f"Answer {name}.", stream=False)
    assert whole == (thought, content, [])
    assert ollama_generate(srv, f"Answer {name}.", stream=True) == whole


@pytest.mark.parametrize("name", ["thought", "opened", "thought-then-call"])
def test_reasoning_format_none_keeps_the_raw_answer_in_the_content(servers, name):
    """llama-server's per-request option: the thought stays in the content, and a call after it is
    still a call (the content gate reads the raw answer as it always did)."""
    answer, opened, (_, _, calls) = ANSWERS[name]
    srv = servers[opened]
    raw = answer.replace(call("Paris"), "").strip() if calls else answer
    for stream in (False, True):
        assert chat(srv, f"Answer {name}.", stream=stream, reasoning_format="none") == (None, raw, calls)


@pytest.mark.parametrize("name", ANSWERS)
def test_streamed_logprobs_are_the_whole_answers_tokens(servers, name):
    """Every token is reported once, streamed as the whole answer reports them: the thought's and its
    markers' too (a token goes with the first chunk whose thought or content reaches past its start)."""
    answer, opened, _ = ANSWERS[name]
    ask = dict(model=MODEL, messages=[{"role": "user", "content": f"Answer {name}."}], temperature=0,
               tools=CHAT_TOOLS, logprobs=True)
    client = _openai(servers[opened])
    whole = client.chat.completions.create(**ask).choices[0].logprobs.content
    chunks = [c.choices[0] for c in client.chat.completions.create(**ask, stream=True)]
    streamed = [t for c in chunks if c.logprobs for t in c.logprobs.content]
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in whole]
    assert bytes(b for t in whole for b in t.bytes) == answer.encode()
    thinking = [c for c in chunks if getattr(c.delta, "reasoning_content", None)]
    assert all(c.logprobs and c.logprobs.content for c in thinking[:1])  # streamed thought carries its tokens


def test_the_stream_sends_the_thought_as_typed_events_before_the_text(servers):
    """Anthropic's events: the thinking block (index 0) starts, takes thinking_deltas and stops before
    the text block (index 1) starts."""
    body = {"model": MODEL, "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "Answer thought."}]}
    r = httpx.post(f"{servers[False].base_url}/v1/messages", json=body, headers={"x-api-key": KEY}, timeout=120)
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    blocks = [(e["type"], e.get("index"), (e.get("content_block") or e.get("delta") or {}).get("type"))
              for e in events if e["type"].startswith("content_block")]
    starts = [b for b in blocks if b[0] == "content_block_start"]
    assert starts == [("content_block_start", 0, "thinking"), ("content_block_start", 1, "text")]
    assert blocks.index(("content_block_stop", 0, None)) < blocks.index(starts[1])
    assert {b[2] for b in blocks if b[1] == 0 and b[0] == "content_block_delta"} == {"thinking_delta"}


@pytest.mark.parametrize("name", ["thought", "thought-then-call", "cut-off-thought", "plain"])
def test_the_responses_stream_builds_the_whole_responses_output(servers, name):
    """The SDK's stream accumulator reads the reasoning item, the message and the calls at the output
    indexes the whole response has them."""
    client = _openai(servers[ANSWERS[name][1]])
    ask = dict(model=MODEL, input=f"Answer {name}.", temperature=0, tools=RESPONSES_TOOLS)
    whole = client.responses.create(**ask).output
    with client.responses.stream(**ask) as events:
        streamed = events.get_final_response().output
    assert [_item(o) for o in streamed] == [_item(o) for o in whole]
    assert [o.type for o in whole][0] == ("reasoning" if ANSWERS[name][2][0] else "message")


def _item(o) -> tuple:
    """An output item as both answers must agree on it (ids are each answer's own)."""
    texts = [c.text for c in getattr(o, "content", None) or []]
    return o.type, o.status, texts, getattr(o, "name", None), getattr(o, "arguments", None)



def _planned(opened: bool, **body) -> bool | None:
    """Plan.thinking of a chat request, for a model whose prompt opens the thought or not."""
    prompter = SimpleNamespace(known_opens=lambda variables: opened, opens_thought_with=lambda variables: opened)
    stub = SimpleNamespace(engine=SimpleNamespace(prompter=prompter, with_defaults=lambda request: request))
    request = ChatCompletionRequest(model=MODEL, **{"messages": [{"role": "user", "content": "hi"}], **body})
    split = request.reasoning_format != "none"
    return asyncio.run(with_thinking(chat_plan(request, 64), stub, split=split)).thinking


@pytest.mark.parametrize("opened", [False, True])
def test_which_answers_are_split(opened):
    """A chat's answer is split, with what the prompt says; not under a grammar (a schema or a forced call
    shapes the answer from its first token: it has no thought, and split after a prompt that opened one
    the JSON was all "thought"), nor a prefill's continuation, nor with reasoning_format none."""
    assert _planned(opened) is opened
    assert _planned(opened, tools=CHAT_TOOLS) is opened  # tool_choice auto: free text
    assert _planned(opened, response_format={"type": "json_object"}) is None
    assert _planned(opened, tools=CHAT_TOOLS, tool_choice="required") is None
    assert _planned(opened, messages=[{"role": "user", "content": "hi"},
                                      {"role": "assistant", "content": "<think>"}]) is None
    assert _planned(opened, reasoning_format="none") is None
    assert _planned(opened, reasoning_format="deepseek") is opened


def test_each_choice_has_its_own_thought(servers):
    """n choices: each one's thought apart from its content, whole and streamed (every choice's stream
    has its own splitter)."""
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "Answer thought."}], n=2)
    thought, content, _ = ANSWERS["thought"][2]
    whole = _openai(servers[False]).chat.completions.create(**ask).choices
    assert [(c.message.reasoning_content, c.message.content) for c in whole] == [(thought, content)] * 2
    got: dict[int, list[str]] = {0: ["", ""], 1: ["", ""]}
    for chunk in _openai(servers[False]).chat.completions.create(**ask, stream=True):
        for c in chunk.choices:
            got[c.index][0] += getattr(c.delta, "reasoning_content", None) or ""
            got[c.index][1] += c.delta.content or ""
    assert got == {0: [thought, content], 1: [thought, content]}
