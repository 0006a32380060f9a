"""Text streamed before tool calls, on every face: with tools offered (tool_choice auto) the text
that cannot be part of a call streams as it comes, and the calls come parsed from the whole answer.

A real server on loopback and each API's official client, over a scripted target
(tests/fake_tier.py) whose answer to "Answer NAME." is ANSWERS[NAME]. Whatever the answer (text,
calls, both in either order, a marker's start in prose, whitespace around calls), the text a client
assembles from the stream is the whole answer's content, and the calls are the same.
"""

from __future__ import annotations

import json

import anthropic
import ollama
import openai
import pytest

from localspec.server import ServerSettings
from tests.fake_tier import Reply, one_model_app
from tests.common import CHAT_TOOLS, MESSAGES_TOOLS, RESPONSES_TOOLS
from tests.server_harness import OpenStream, ServerThread

KEY = "tool-stream-key"
MODEL = "scripted-tool-stream"


def call(city: str) -> str:
    return f'<tool_call>\n{{"name": "weather", "arguments": {{"city": "{city}"}}}}\n</tool_call>'


ANSWERS = {
    "plain": "Paris is the capital of France.",
    "text-then-call": f"Let me check the weather.\n{call('Paris')}",
    "call-then-text": f"{call('Paris')}\nI asked for the weather in Paris.",
    "only-calls": f"{call('Paris')}\n{call('Rome')}\n",
    "marker-start": "A <tool is no tag, nor is <tool_call without its end: <tool_",
    "whitespace-around": f"Checking:  \n\n{call('Paris')}\n\n  Done.  \n",
    "leading-whitespace": f"  \nSure. {call('Rome')}",
    "leading-whitespace-text": " Paris.\n",
    "trailing-whitespace": "Paris.\n\n",
    "not-a-call": "<tool_call>not JSON</tool_call> Sorry.",
    "multi-byte": f"Café ☕ {call('Lyon')} ok",
    "lone-surrogate": call("Par\\udfffis"),  # a model wrote an escape JSON allows and no answer can encode
    # Qwen2.5's template shows a call as `{{"name": ...}}` and the 1.5B copies the braces: pydantic-ai's and
    # openai-agents' tool agents read that answer as text and stopped
    "doubled-braces": '{{"name": "weather", "arguments": {"city": "Paris"}}}',
    "doubled-braces-tagged": '<tool_call>\n{{"name": "weather", "arguments": {"city": "Rome"}}}\n</tool_call>',
}
PACED = "Paris is the capital of France, and its largest city by far."


def script(prompt: str) -> Reply | str:
    if "Answer paced." in prompt:  # still decoding when its first text reaches the client
        return Reply(PACED, pace_s=0.02)
    for name, answer in ANSWERS.items():
        if f"Answer {name}." in prompt:
            return answer
    return "OK."


@pytest.fixture(scope="module")
def served(module_home):
    app, _ = one_model_app(model_id=MODEL, script=script,
                           settings=ServerSettings(api_key=KEY, cache=False, router=False, max_tokens_cap=512))
    with ServerThread(app) as srv:
        yield srv


Calls = list[tuple[str, dict]]


# ---------------------------------------------------------------- each face, whole and streamed


def chat(srv, question: str, *, stream: bool) -> tuple[str, Calls]:
    client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key=KEY, max_retries=0, timeout=120)
    ask = dict(model=MODEL, messages=[{"role": "user", "content": question}], temperature=0,
               tools=CHAT_TOOLS)
    if not stream:
        message = client.chat.completions.create(**ask).choices[0].message
        return message.content or "", [(c.function.name, json.loads(c.function.arguments))
                                       for c in message.tool_calls or []]
    text, named, args = "", {}, {}
    for chunk in client.chat.completions.create(**ask, stream=True):
        delta = chunk.choices[0].delta
        text += delta.content or ""
        for d in delta.tool_calls or []:
            named[d.index] = named.get(d.index) or d.function.name
            args[d.index] = args.get(d.index, "") + (d.function.arguments or "")
    return text, [(named[i], json.loads(args[i])) for i in sorted(named)]


def responses(srv, question: str, *, stream: bool) -> tuple[str, Calls]:
    client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key=KEY, max_retries=0, timeout=120)
    ask = dict(model=MODEL, input=question, temperature=0, tools=RESPONSES_TOOLS)
    if not stream:
        output = client.responses.create(**ask).output
        text = "".join(p.text for o in output if o.type == "message" for p in o.content)
        return text, [(o.name, json.loads(o.arguments)) for o in output if o.type == "function_call"]
    text, calls = "", []
    for e in client.responses.create(**ask, stream=True):
        if e.type == "response.output_text.delta":
            text += e.delta
        elif e.type == "response.output_item.done" and e.item.type == "function_call":
            calls.append((e.item.name, json.loads(e.item.arguments)))
    return text, calls


def messages(srv, question: str, *, stream: bool) -> tuple[str, Calls]:
    client = anthropic.Anthropic(base_url=srv.base_url, api_key=KEY, max_retries=0, timeout=120)
    ask = dict(model=MODEL, max_tokens=256, messages=[{"role": "user", "content": question}], tools=MESSAGES_TOOLS,
               extra_body={"temperature": 0})
    if not stream:
        content = client.messages.create(**ask).content
    else:
        text, named, args = "", {}, {}
        for e in client.messages.create(**ask, stream=True):  # the raw events, as a client reads them
            if e.type == "content_block_start" and e.content_block.type == "tool_use":
                named[e.index] = e.content_block.name
            elif e.type == "content_block_delta" and e.delta.type == "text_delta":
                text += e.delta.text
            elif e.type == "content_block_delta" and e.delta.type == "input_json_delta":
                args[e.index] = args.get(e.index, "") + e.delta.partial_json
        return text, [(named[i], json.loads(args[i])) for i in sorted(named)]
    return ("".join(b.text for b in content if b.type == "text"),
            [(b.name, b.input) for b in content if b.type == "tool_use"])


def ollama_chat(srv, question: str, *, stream: bool) -> tuple[str, Calls]:
    client = ollama.Client(host=srv.base_url, timeout=120, headers={"Authorization": f"Bearer {KEY}"})
    ask = dict(model=MODEL, messages=[{"role": "user", "content": question}], tools=CHAT_TOOLS,
               options={"temperature": 0})
    parts = list(client.chat(**ask, stream=True)) if stream else [client.chat(**ask, stream=False)]
    return ("".join(p.message.content or "" for p in parts),
            [(c.function.name, dict(c.function.arguments)) for p in parts for c in p.message.tool_calls or []])


FACES = {"chat": chat, "responses": responses, "messages": messages, "ollama": ollama_chat}


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("name", ANSWERS)
def test_the_streamed_text_and_calls_are_the_whole_answers(served, face, name):
    """What a client assembles from the stream is the whole answer's content and calls, whether or
    not a call was in it, and wherever."""
    ask = FACES[face]
    whole = ask(served, f"Answer {name}.", stream=False)
    assert ask(served, f"Answer {name}.", stream=True) == whole
    assert ("<tool_call>" in whole[0]) == (name == "not-a-call")  # the calls were parsed out of the content
    assert bool(whole[1]) == (name not in ("plain", "marker-start", "leading-whitespace-text", "trailing-whitespace",
                                           "not-a-call"))


@pytest.mark.parametrize("name", ANSWERS)
def test_streamed_logprobs_are_the_tokens_behind_each_pieces_text(served, name):
    """Logprobs with tools offered: a piece streamed before the end carries the tokens its text came
    from (one byte a token here), the tokens behind held text come on the last chunk, and all of them
    are the whole answer's."""
    client = openai.OpenAI(base_url=f"{served.base_url}/v1", api_key=KEY, max_retries=0, timeout=120)
    ask = dict(model=MODEL, messages=[{"role": "user", "content": f"Answer {name}."}], temperature=0,
               tools=CHAT_TOOLS, logprobs=True)
    whole = client.chat.completions.create(**ask).choices[0].logprobs.content
    chunks = [c.choices[0] for c in client.chat.completions.create(**ask, stream=True)]
    early = [c for c in chunks if c.delta.content and c.logprobs]  # streamed as it came
    assert all(bytes(b for t in c.logprobs.content for b in t.bytes) == c.delta.content.encode() for c in early)
    streamed = [t for c in chunks if c.logprobs for t in c.logprobs.content]
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in whole]
    assert bytes(b for t in whole for b in t.bytes) == ANSWERS[name].encode()


# ---------------------------------------------------------------- as it comes


def _running(served) -> list:
    """The server's admitted requests still unfinished (a copy: the server's loop replaces the set)."""
    return [j for j in list(served.app.state.admission.jobs) if not j.done.is_set()]


STREAMS = {  # each face's request for the paced answer, and how it sends a piece of text
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Answer paced."}], "tools": CHAT_TOOLS},
             lambda d: (d.get("choices") or [{}])[0].get("delta", {}).get("content")),
    "responses": ("/v1/responses", {"input": "Answer paced.", "tools": RESPONSES_TOOLS},
                  lambda d: d["type"] == "response.output_text.delta" and d["delta"]),
    "messages": ("/v1/messages", {"max_tokens": 256, "messages": [{"role": "user", "content": "Answer paced."}],
                                  "tools": MESSAGES_TOOLS},
                 lambda d: d["type"] == "content_block_delta" and d["delta"].get("text")),
    "ollama": ("/api/chat", {"messages": [{"role": "user", "content": "Answer paced."}], "tools": CHAT_TOOLS},
               lambda d: not d["done"] and d["message"]["content"]),
}


@pytest.mark.parametrize("face", STREAMS)
def test_text_with_tools_offered_streams_while_the_answer_is_decoding(served, face):
    """Tools offered, a text answer comes in pieces, the first while the engine is still decoding
    it (it was held whole to the end, as one piece: an agent's client saw nothing until then)."""
    path, body, text_of = STREAMS[face]
    stream = OpenStream(served.base_url, path, KEY, {"model": MODEL, "temperature": 0, "stream": True, **body})
    assert stream.status_code == 200
    pieces: list[str] = []
    try:
        for line in stream.lines():
            data = line.removeprefix("data: ")
            if not data.startswith("{"):  # an SSE event's name, a blank line, [DONE]
                continue
            if text := text_of(json.loads(data)):
                if not pieces:
                    assert _running(served), "the first text came after the answer was done"
                pieces.append(text)
    finally:
        stream.close()
    assert len(pieces) > 1 and "".join(pieces) == PACED


@pytest.mark.parametrize("face", FACES)
def test_a_lone_surrogate_escape_in_a_calls_arguments_reads_as_a_replacement_character(served, face):
    """{"city": "Par\\udfffis"} in a call was a 500 and a traceback on /v1/messages and /api/chat (a stream cut
    off mid-way on /api/chat): the parsed arguments held a lone surrogate, which no JSON answer can encode."""
    for stream in (False, True):
        assert FACES[face](served, "Answer lone-surrogate.", stream=stream) == ("", [("weather", {"city": "Par\ufffdis"})])
