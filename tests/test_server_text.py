"""The text a client receives, as each API delivers it: stop strings, multi-byte characters,
logprobs that line up with the text.

A real server on loopback and the `openai` client, over a scripted model pair (tests/fake_tier.py)
whose tokens are single bytes: an emoji is four tokens, and a stop string always spans several, so
every case here crosses token boundaries. The draft model says what the target says, so mode draft
accepts whole runs of k tokens in one verify step.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import openai
import pytest

from localspec.engine.events import Token, TokenLogprob
from localspec.server import ServerSettings
from localspec.server.replies import TextOffsets, chat_logprobs, completion_logprobs
from localspec.server.schemas import ChatCompletionRequest
from localspec.server.translate import CallWatch, chat_plan, parse_tool_calls
from tests.fake_tier import scripted, scripted_app, scripted_backend, scripted_pipeline, scripted_tier
from tests.server_harness import ServerThread

MODEL = "scripted-text"
FOX = "The quick brown fox jumps. 🎉 Done."
SCRIPT = scripted({"Quote the fox": FOX})
MODES = ("off", "draft")


@pytest.fixture(scope="module")
def client(module_home) -> openai.OpenAI:
    tier = scripted_tier(model_id=MODEL, script=SCRIPT, draft_script=SCRIPT, mode="draft")
    app = scripted_app(backend=scripted_backend(pipeline=scripted_pipeline(tiers=[tier])),
                       settings=ServerSettings(cache=False, router=False, max_tokens_cap=256))
    with ServerThread(app) as srv:
        yield openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="none", max_retries=0, timeout=120)


def chat_kw(mode: str, **kw) -> dict:
    return dict(model=MODEL, messages=[{"role": "user", "content": "Quote the fox."}], temperature=0,
                extra_body={"localspec": {"mode": mode, "k": 8}}, **kw)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("stop", "answer"), [("brown f", "The quick "), ("T", ""), ("🎉", "The quick brown fox jumps. ")])
def test_chat_logprobs_end_where_the_stop_string_cuts_the_answer(client, mode, stop, answer):
    """The tokens that spelled the stop string are generated (usage counts them) but not in the answer,
    so not in its logprobs either: the logprobs' bytes are the answer's, whole and streamed."""
    whole = client.chat.completions.create(**chat_kw(mode, stop=[stop], logprobs=True, top_logprobs=2))
    choice = whole.choices[0]
    assert choice.message.content == answer and choice.finish_reason == "stop"
    assert bytes(b for t in choice.logprobs.content for b in t.bytes) == answer.encode()
    generated = len((answer + stop).encode())  # one byte a token, the stop string's last one included
    assert whole.usage.completion_tokens == generated

    chunks = list(client.chat.completions.create(**chat_kw(mode, stop=[stop], logprobs=True, stream=True)))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer
    assert bytes(b for t in streamed for b in t.bytes) == answer.encode()
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]


def test_held_text_keeps_its_logprobs_up_to_the_stop_string(client):
    """With tools offered the text is parsed whole at the end, and what might be part of a call (here
    the trailing space) is held to it; the logprobs, streamed and held, are still only the answer's."""
    tools = [{"type": "function", "function": {"name": "noop", "parameters": {"type": "object"}}}]
    kw = chat_kw("off", stop=["brown f"], logprobs=True, tools=tools)
    whole = client.chat.completions.create(**kw).choices[0]
    chunks = [c.choices[0] for c in client.chat.completions.create(**kw, stream=True) if c.choices]
    streamed = [t for c in chunks if c.logprobs for t in c.logprobs.content]
    assert whole.message.content == "".join(c.delta.content or "" for c in chunks) == "The quick "
    assert bytes(b for t in streamed for b in t.bytes) == bytes(b for t in whole.logprobs.content for b in t.bytes)
    assert bytes(b for t in streamed for b in t.bytes) == b"The quick "


@pytest.mark.parametrize("mode", MODES)
def test_completion_logprobs_end_where_the_stop_string_cuts_the_answer(client, mode):
    kw = dict(model=MODEL, prompt="Quote the fox.", temperature=0, stop=["jumps"], logprobs=1,
              extra_body={"localspec": {"mode": mode, "k": 8}})
    whole = client.completions.create(**kw).choices[0]
    assert whole.text == "The quick brown fox " and "".join(whole.logprobs.tokens) == whole.text
    chunks = [c.choices[0] for c in client.completions.create(stream=True, **kw) if c.choices]
    assert "".join(c.text for c in chunks) == whole.text
    assert [t for c in chunks if c.logprobs for t in c.logprobs.tokens] == whole.logprobs.tokens


@pytest.mark.parametrize("mode", MODES)
def test_completion_text_offsets_count_characters_through_a_multi_byte_one(client, mode):
    """🎉 is four tokens, each one U+FFFD on its own: the offsets count the answer's characters, so the
    emoji's tokens all start where the emoji does and the next token where the text has it."""
    kw = dict(model=MODEL, prompt="Quote the fox.", temperature=0, logprobs=1,
              extra_body={"localspec": {"mode": mode, "k": 8}})
    whole = client.completions.create(**kw).choices[0]
    assert whole.text == FOX
    expected = [i for i, ch in enumerate(FOX) for _ in ch.encode()]  # one offset a byte, a token a byte
    assert whole.logprobs.text_offset == expected
    chunks = [c.choices[0] for c in client.completions.create(stream=True, **kw) if c.choices]
    assert [o for c in chunks if c.logprobs for o in c.logprobs.text_offset] == expected
    assert "\ufffd" not in "".join(c.text for c in chunks)


# ---------------------------------------------------------------- logprob token names (units)

_VOCAB = {1: b" \xf0\x9f", 2: b"\x8e", 3: b"\x89", 4: b"\x8f", 5: b"\xf0\x9f", 6: b"!", 7: b"", 8: b""}
_SPECIAL = {7: "<|im_end|>", 8: "<|endoftext|>"}


class _Vocab:
    def piece(self, token: int) -> bytes:
        return _VOCAB[token]

    def token_text(self, token: int) -> str:
        return _SPECIAL.get(token) or _VOCAB[token].decode("utf-8", errors="replace")


def _emoji_tokens() -> list[Token]:
    """ 🎉!: three tokens for the emoji, the alternatives other emoji parts and the two end tokens."""
    def lp(token: int, value: float, *top: tuple[int, float]) -> Token:
        return Token(text="", ids=(token,), origin="target", logprob=TokenLogprob(token, value, top))

    return [lp(1, -0.1, (1, -0.1), (5, -2.5), (6, -3.0)), lp(2, -0.2, (2, -0.2), (4, -1.9), (3, -4.0)),
            lp(3, -0.3, (3, -0.3), (7, -2.0), (8, -2.2)), lp(6, -0.4, (6, -0.4), (7, -1.5))]


def test_completion_logprobs_name_each_part_of_a_character_apart():
    """Each part of a multi-byte character was U+FFFD: top_logprobs (a dict by name) kept one of them,
    with another's logprob, and the two end tokens were both "". Now named as OpenAI names them."""
    b = SimpleNamespace(engine=SimpleNamespace(target=_Vocab()))
    lp = completion_logprobs(b, _emoji_tokens(), TextOffsets())
    assert lp.tokens == ["bytes: \\xf0\\x9f", "bytes:\\x8e", "bytes:\\x89", "!"]
    assert lp.top_logprobs == [{"bytes: \\xf0\\x9f": -0.1, "bytes:\\xf0\\x9f": -2.5, "!": -3.0},
                               {"bytes:\\x8e": -0.2, "bytes:\\x8f": -1.9, "bytes:\\x89": -4.0},
                               {"bytes:\\x89": -0.3, "<|im_end|>": -2.0, "<|endoftext|>": -2.2},
                               {"!": -0.4, "<|im_end|>": -1.5}]
    assert lp.text_offset == [0, 1, 1, 2]  # " 🎉!": the emoji's parts start where it does


def test_chat_logprobs_name_an_end_token_among_the_alternatives():
    b = SimpleNamespace(engine=SimpleNamespace(target=_Vocab()))
    content = chat_logprobs(b, _emoji_tokens()).content
    assert [t.bytes for t in content] == [[32, 0xF0, 0x9F], [0x8E], [0x89], [33]]
    assert [(t.token, t.bytes) for t in content[2].top_logprobs][1:] == [
        ("<|im_end|>", list(b"<|im_end|>")), ("<|endoftext|>", list(b"<|endoftext|>"))]


# ---------------------------------------------------------------- text before tool calls (units)

CALL = '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TOOL_ANSWERS = [
    "Paris is the capital of France.",
    f"Let me check.\n{CALL}",
    f"{CALL}\nI asked for the weather.",
    f"{CALL}\n{CALL}\n",
    "A <tool is no tag, nor is <tool_call without its end: <tool_",
    f"Checking:  \n\n{CALL}\n\n  Done.  \n",
    f"  \nSure. {CALL}",
    " Paris.\n",
    "Paris.\n\n",
    "<tool_call>not JSON</tool_call> Sorry.",
    'Café ☕ <tool_call>{"name": "weather", "arguments": {}}</tool_call> ok',
]


UNTAGGED = [  # what Qwen2.5-Coder 1.5B wrote for a call at temperature 1, and near misses
    'Here is the call:\n\n```json\n{"name": "weather", "arguments": {"city": "Paris"}}\n```\n\nIt reads the weather.',
    '{"function": "weather", "arguments": {"city": "Paris"}}',
    '```json\n{"name": "forecast", "arguments": {}}\n```',  # a tool not offered: text
    '{"name": "weather"} is how a call looks.',  # not one JSON object: text
    'Use ```json blocks\n```python\nprint(1)\n```',
    # the template's example, `{{"name": <function-name>, ...}}`, copied with its braces doubled (pydantic-ai's
    # and openai-agents' tool agents got this from the 1.5B, and saw text)
    '{{"name": "weather", "arguments": {"city": "Paris"}}}',
]


@pytest.mark.parametrize(("answer", "content", "calls"), [
    (UNTAGGED[0], "Here is the call:\n\n\n\nIt reads the weather.", [("weather", {"city": "Paris"})]),
    (UNTAGGED[1], None, [("weather", {"city": "Paris"})]),
    (UNTAGGED[2], UNTAGGED[2], []),
    (UNTAGGED[3], UNTAGGED[3], []),
    (UNTAGGED[5], None, [("weather", {"city": "Paris"})]),
    ('{"function": {"name": "weather", "arguments": "{\\"city\\": \\"Rome\\"}"}}', None, [("weather", {"city": "Rome"})]),
    # where the answer has tagged calls, those are its calls: a code block beside them is text
    (f'{CALL} and ```json\n{{"name": "weather", "arguments": {{}}}}\n```',
     'and ```json\n{"name": "weather", "arguments": {}}\n```', [("weather", {"city": "Paris"})]),
])
def test_a_call_a_small_model_writes_untagged_counts_when_it_names_an_offered_tool(answer, content, calls):
    """Qwen2.5-Coder 1.5B answered Claude Code-style tools with a ```json block or a bare object (a name under
    "function" too) instead of <tool_call> tags: read as text, the client saw JSON and no call."""
    got_content, got = parse_tool_calls(answer, forced=False, names={"weather"})
    assert got_content == content
    assert [(c.function.name, json.loads(c.function.arguments)) for c in got] == calls
    if not answer.startswith(CALL):  # without the offered names, only tagged calls count
        assert parse_tool_calls(answer, forced=False) == (answer, [])


@pytest.mark.parametrize("answer", UNTAGGED)
def test_text_sent_before_an_untagged_call_is_the_start_of_the_final_content(answer):
    content = parse_tool_calls(answer, forced=False, names={"weather"})[0] or ""
    for size in (1, 2, 3, 7, len(answer)):
        for sent in _fed(answer, size):
            assert content.startswith(sent), (size, sent, content)


def _fed(answer: str, size: int) -> list[str]:
    """What a CallWatch has sent after each of `answer`'s chunks of `size` characters, in all."""
    gate, sent, out = CallWatch(), "", []
    for i in range(0, len(answer), size):
        sent += gate.feed(answer[i:i + size])
        out.append(sent)
    return out


@pytest.mark.parametrize("answer", TOOL_ANSWERS)
def test_text_sent_before_the_end_is_always_the_start_of_the_final_content(answer):
    """Whatever the chunks, what went out is never taken back: the content parse_tool_calls leaves
    (the calls removed, stripped when there were any) starts with it at every point."""
    content = parse_tool_calls(answer, forced=False)[0] or ""
    for size in (1, 2, 3, 7, len(answer)):
        for sent in _fed(answer, size):
            assert content.startswith(sent), (size, sent, content)


@pytest.mark.parametrize(("answer", "before_the_end"), [
    ("Paris is the capital of France.", "Paris is the capital of France."),  # all of it, as it comes
    ("Paris.\n\n", "Paris."),  # trailing whitespace: a call after it would make it the stripped end
    (f"Let me check.\n{CALL}", "Let me check."),  # the call and the whitespace before it wait
    (f"{CALL}\nI asked for the weather.", ""),  # everything after a call's start waits for the end
    ("A <tool is no tag, nor is <tool_call without its end: <tool_",
     "A <tool is no tag, nor is <tool_call without its end:"),  # a start of the marker waits, then goes
    (" Paris.\n", ""),  # leading whitespace is content only if no call follows: held whole
])
def test_what_a_call_watch_sends_before_the_end(answer, before_the_end):
    assert _fed(answer, 1)[-1] == before_the_end


def test_a_possible_marker_is_held_until_the_text_after_it_says_it_is_not_one():
    gate = CallWatch()
    assert [gate.feed(t) for t in ("Use ", "<tool", "_c", " tags", " <tool_call>", "{}")] == [
        "Use", "", "", " <tool_c tags", "", ""]


def test_only_tools_offered_without_a_forced_call_stream_text_before_the_end():
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    ask = dict(model="m", messages=[{"role": "user", "content": "hi"}])
    assert chat_plan(ChatCompletionRequest(**ask), 64).text_gate() is None  # no tools: all of it, as it comes
    assert isinstance(chat_plan(ChatCompletionRequest(**ask, tools=tools), 64).text_gate(), CallWatch)
    for forced in ("required", {"type": "function", "function": {"name": "weather"}}):
        gate = chat_plan(ChatCompletionRequest(**ask, tools=tools, tool_choice=forced), 64).text_gate()
        assert gate is not None and gate.feed('{"name": "weather", "arguments": {}}') == ""  # the call's JSON
