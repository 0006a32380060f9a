"""llama.cpp's server API (/infill, /completion, /tokenize, /detokenize, /apply-template, /props): a
real server on loopback, driven with raw HTTP the way llama.vscode and llama.vim send their requests.

The server answers from a scripted target (tests/fake_tier.py, whose vocabulary has Qwen2.5-Coder's
fill-in-the-middle and repo-level tokens) whose answers depend on the prompt the endpoint built, so
each test sees what the request became. What the real model says through these routes is checked
in test_server.py (`llamacpp_*` tests).
"""

from __future__ import annotations

import json

import pytest

from localspec.server import ServerSettings
from localspec.engine.events import Done, Stats
from localspec.engine.grammar_limits import LIMITS
from localspec.server.llamacpp import (SNIPPET_SEPARATOR, Cutoff, ExtraChunk, InfillRequest, LlamaCppStopType,
                                       Tokenizer, infill_prompt, picked, stop_type)
from tests.fake_tier import SPECIAL, Reply, scripted_app, scripted_backend, scripted_pipeline, scripted_tier
from tests.server_harness import ServerThread, refuse_after, request

MODEL = "scripted-coder"
PROMPTS: list[str] = []  # every prompt the scripted model read, newest last
ADD_BODY = "    return a + b\n"
INDENTED = "    x = 1\n    y = 2\nz = 3\n"  # its third line is indented less than the first two


def script(prompt: str) -> Reply | str:
    PROMPTS.append(prompt)
    if "def add(a, b):" in prompt:
        return ADD_BODY
    if "def indented():" in prompt:
        return INDENTED
    if "Write a story" in prompt:
        return Reply("Once upon a time. " * 4, pace_s=0.001)
    if "Break down" in prompt:
        return Reply("Never said.", fail="llama_decode returned -3")
    return "OK."


@pytest.fixture(scope="module")
def served(module_home):
    tier = scripted_tier(model_id=MODEL, script=script)
    backend = scripted_backend(pipeline=scripted_pipeline(tiers=[tier]))
    app = scripted_app(backend=backend, settings=ServerSettings(cache=False, router=False, max_tokens_cap=256))
    with ServerThread(app) as srv:
        srv.tier = tier
        yield srv


def post(served, path: str, body: dict):
    return request(served.base_url, "POST", path, json_body=body)


def vscode_infill(prefix: str, suffix: str, prompt: str, chunks: list[dict], **over) -> dict:
    """llama.vscode's /infill body (src/llama-server.ts, createRequestPayload), its defaults filled in."""
    return {"id_slot": 0, "input_prefix": prefix, "input_suffix": suffix, "input_extra": chunks, "prompt": prompt,
            "n_predict": 128, "n_cmpl": 1, "top_k": 40, "top_p": 0.99, "stream": False,
            "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "t_max_prompt_ms": 500,
            "t_max_predict_ms": 500, **over}


def sse_lines(text: str) -> list[dict]:
    """The `data:` lines of an SSE body (keep-alive comments left out)."""
    return [json.loads(line.removeprefix("data: ")) for line in text.split("\n\n") if line.startswith("data: ")]


# ---------------------------------------------------------------- /infill


def test_infill_as_llama_vscode_sends_it_lays_out_the_repo_level_prompt(served):
    chunks = [{"text": "X = 1\n", "time": 1, "filename": "a.py"}, {"text": "Y = 2\n", "time": 2, "filename": "b.py"}]
    r = post(served, "/infill", vscode_infill("import math\n", "\nprint(add(1, 2))\n", "def add(a, b):",
                                              chunks, n_indent=0))
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["content"] == ADD_BODY and answer["stop"] is True and answer["stop_type"] == "eos"
    assert PROMPTS[-1].startswith(  # llama-server's layout for a vocabulary with <|repo_name|> and <|file_sep|>
        "<|repo_name|>myproject\n<|file_sep|>a.py\nX = 1\n<|file_sep|>b.py\nY = 2\n<|file_sep|>filename\n"
        "<|fim_prefix|>import math\ndef add(a, b):<|fim_suffix|>\nprint(add(1, 2))\n<|fim_middle|>")
    # What llama.vscode reads: content, tokens_cached, truncated, timings, generation_settings.n_ctx.
    assert answer["truncated"] is False and answer["tokens_cached"] > 0
    assert answer["generation_settings"]["n_ctx"] == served.tier.engine.target.n_ctx_seq
    assert answer["timings"]["predicted_n"] == answer["tokens_predicted"] == len(ADD_BODY)  # a byte a token
    assert answer["timings"]["prompt_n"] + answer["timings"]["cache_n"] == answer["tokens_evaluated"]


def test_n_cmpl_answers_that_many_completions_in_an_array_and_past_the_slots_is_llama_servers_400(served):
    """llama.vscode sends n_cmpl 3 (max_parallel_completions) and reads an array of answers."""
    r = post(served, "/infill", vscode_infill("", "", "def add(a, b):", [], n_cmpl=3, temperature=0))
    assert r.status_code == 200, r.text
    answers = r.json()
    assert [a["index"] for a in answers] == [0, 1, 2] and {a["content"] for a in answers} == {ADD_BODY}
    r = post(served, "/infill", vscode_infill("", "", "def add(a, b):", [], n_cmpl=7))
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith("Field 'n_cmpl': Value must be between 1 <= value <= 4")


def test_infill_as_llama_vim_sends_it_answers_the_fields_it_asks_for_flattened(served):
    """llama.vim (autoload/llama.vim) asks for response_fields with slashes and reads them as flat keys,
    and tells a JSON answer by `"content":"` in the raw text."""
    fields = ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
              "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
              "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated", "tokens_cached"]
    body = {"id_slot": 0, "input_prefix": "", "input_suffix": "\n", "input_extra": [], "prompt": "def add(a, b):",
            "n_predict": 128, "stop": [], "n_indent": 0, "top_k": 40, "top_p": 0.90,
            "samplers": ["top_k", "top_p", "infill"], "stream": False, "cache_prompt": True, "t_max_prompt_ms": 500,
            "t_max_predict_ms": 1000, "response_fields": fields}
    r = post(served, "/infill", body)
    assert r.status_code == 200 and '"content":"' in r.text
    assert set(r.json()) == set(fields) and r.json()["content"] == ADD_BODY
    # Its ring buffer's warm-up: the extra context alone, nothing to generate, no field asked for.
    warm = {"id_slot": 0, "input_prefix": "", "input_suffix": "", "prompt": "", "n_predict": 0, "temperature": 0.0,
            "input_extra": [{"text": "Z = 3\n", "time": 5, "filename": "c.py"}], "samplers": [], "stream": False,
            "cache_prompt": True, "t_max_prompt_ms": 1, "t_max_predict_ms": 1, "response_fields": [""]}
    r = post(served, "/infill", warm)
    assert r.status_code == 200 and r.json() == {}
    assert "<|file_sep|>c.py\nZ = 3\n" in PROMPTS[-1]
    r = post(served, "/infill", {**warm, "response_fields": None})
    assert r.json()["content"] == "" and r.json()["tokens_predicted"] == 0


def test_n_indent_ends_the_answer_at_a_line_indented_less_whole_and_streamed(served):
    """llama-server's n_indent (both plugins send the cursor line's indentation): the line that starts
    indented less ends the answer, its newline kept."""
    body = vscode_infill("def indented():\n", "", "", [], n_indent=4)
    whole = post(served, "/infill", body).json()
    assert whole["content"] == "    x = 1\n    y = 2\n" and whole["stop_type"] == "limit"
    lines = sse_lines(post(served, "/infill", {**body, "stream": True}).text)
    assert "".join(line["content"] for line in lines) == whole["content"]
    assert lines[-1]["stop"] is True and lines[-1]["stop_type"] == "limit"
    assert post(served, "/infill", {**body, "n_indent": 0}).json()["content"] == INDENTED


def test_a_refused_completion_of_several_cancels_those_already_submitted(served, monkeypatch):
    """n_cmpl 3 and the queue full at the third: the two running would answer nobody; they are cancelled."""
    submitted = refuse_after(served.app.state.server, monkeypatch, admitted=2)
    r = post(served, "/infill", vscode_infill("", "", "def add(a, b):", [], n_cmpl=3))
    assert r.status_code == 429 and r.json()["error"]["code"] == 429
    assert len(submitted) == 2 and all(job.cancelled for job in submitted)


def test_a_model_without_fim_tokens_is_a_clear_400_in_llama_servers_shape(served, monkeypatch):
    monkeypatch.setattr(served.tier.engine.target, "tokenize",  # bytes only: no special token at all
                        lambda text, add_special=True, parse_special=True: list(text.encode()))
    r = post(served, "/infill", vscode_infill("a", "b", "", []))
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == 400 and error["type"] == "invalid_request_error"
    assert "fill-in-the-middle" in error["message"]


def test_without_repo_tokens_the_extra_chunks_are_snippets_before_the_prefix(served, monkeypatch):
    """A vocabulary with the FIM tokens but not <|repo_name|>/<|file_sep|>: the chunks' texts alone,
    each after a separator, as llama-server does."""
    real = served.tier.engine.target.tokenize

    def no_repo_tokens(text, add_special=True, parse_special=True):
        if text in ("<|repo_name|>", "<|file_sep|>"):
            return list(text.encode())
        return real(text, add_special, parse_special)

    monkeypatch.setattr(served.tier.engine.target, "tokenize", no_repo_tokens)
    r = post(served, "/infill", vscode_infill("p\n", "s\n", "def add(a, b):", [{"filename": "a.py", "text": "X\n"}]))
    assert r.status_code == 200, r.text
    assert PROMPTS[-1].startswith(f"{SNIPPET_SEPARATOR}X\n<|fim_prefix|>p\ndef add(a, b):<|fim_suffix|>s\n")


def test_refused_and_bounded_fields_are_400s_naming_them(served):
    for field, value in [("mirostat", 2), ("logit_bias", [[1, -100]]), ("n_probs", 3), ("lora", [{"id": 0}]),
                         ("n_predict", -5)]:
        r = post(served, "/infill", vscode_infill("a", "b", "", [], **{field: value}))
        assert r.status_code == 400 and field in r.json()["error"]["message"], (field, r.text)
    too_many = [{"filename": "x", "text": "y"}] * 257
    r = post(served, "/infill", vscode_infill("a", "b", "", too_many))
    assert r.status_code == 400 and "input_extra" in r.json()["error"]["message"]
    r = post(served, "/infill", vscode_infill("a", "b", "", [{"filename": "x", "text": 5}]))
    assert r.status_code == 400 and r.json()["error"]["code"] == 400
    r = post(served, "/infill", vscode_infill("a", "b", "", [], model="nope"))
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = post(served, "/infill", vscode_infill("a", "b", "", [], n_cmpl=2, stream=True))
    assert r.status_code == 400 and "n_cmpl" in r.json()["error"]["message"]


# ---------------------------------------------------------------- /completion


def test_completion_whole_and_streamed_agree_and_the_stream_ends_with_stop_true(served):
    body = {"prompt": "Write a story.", "n_predict": 128, "temperature": 0}
    whole = post(served, "/completion", body).json()
    assert whole["content"] == "Once upon a time. " * 4 and whole["stop"] is True and whole["model"] == MODEL
    r = post(served, "/completion", {**body, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    lines = sse_lines(r.text)
    assert len(lines) > 3 and all(line["stop"] is False for line in lines[:-1]) and lines[-1]["stop"] is True
    assert "".join(line["content"] for line in lines) == whole["content"] and "[DONE]" not in r.text
    assert lines[-1]["tokens_predicted"] == whole["tokens_predicted"]
    short = post(served, "/completions", {**body, "n_predict": 3}).json()  # llama-server's alias
    assert short["content"] == "Onc" and short["stop_type"] == "limit"


def test_a_stop_string_that_ends_the_answer_is_its_stop_type_word_and_stopping_word(served):
    """llama-server's `stop_type` "word" and the string in `stopping_word`, on the whole answer and on the
    stream's last line (its other lines carry neither, as llama-server's do not); an answer its end token
    ended is "eos" with an empty `stopping_word`, one n_predict cut is "limit"."""
    body = {"prompt": "Write a story.", "n_predict": 128, "temperature": 0, "stop": ["zebra", "time"]}
    whole = post(served, "/completion", body).json()
    assert whole["content"] == "Once upon a " and whole["stop_type"] == "word" and whole["stopping_word"] == "time"
    lines = sse_lines(post(served, "/completion", {**body, "stream": True}).text)
    assert "".join(line["content"] for line in lines) == whole["content"]
    assert lines[-1]["stop"] is True and lines[-1]["stop_type"] == "word" and lines[-1]["stopping_word"] == "time"
    assert not any("stop_type" in line or "stopping_word" in line for line in lines[:-1])
    ended = post(served, "/completion", {**body, "stop": ["zebra"]}).json()
    assert ended["stop_type"] == "eos" and ended["stopping_word"] == ""
    cut = post(served, "/completion", {**body, "n_predict": 3}).json()
    assert cut["stop_type"] == "limit" and cut["stopping_word"] == ""
    infill = post(served, "/infill", vscode_infill("", "", "def add(a, b):", [], stop=["+"], n_indent=0)).json()
    assert infill["content"] == "    return a " and infill["stop_type"] == "word" and infill["stopping_word"] == "+"


def test_stop_type_says_none_for_an_answer_that_ended_otherwise():
    """A cut-off cancels the job; without one, a cancelled answer is no llama-server reason: "none"."""
    st = Stats()
    assert stop_type(Done("cancelled", st, "x"), cut=False) is LlamaCppStopType.NONE
    assert stop_type(Done("cancelled", st, "x"), cut=True) is LlamaCppStopType.LIMIT
    assert stop_type(Done("stop", st, "x", stop_sequence="\n"), cut=False) is LlamaCppStopType.WORD


def test_grammar_and_json_schema_out_of_bounds_or_together_are_400s_naming_the_field(served):
    """Checked before the request is queued, in llama-server's error shape (the grammars themselves are applied by the
    real model: test_server.py's llamacpp tests)."""
    huge = "root ::= " + " | ".join(f'"w{i}"' for i in range(LIMITS.max_grammar_bytes // 6))
    r = post(served, "/completion", {"prompt": "Write a story.", "grammar": huge})
    error = r.json()["error"]
    assert r.status_code == 400 and error["code"] == 400 and error["type"] == "invalid_request_error"
    assert error["message"].startswith("grammar: the grammar's size in bytes") and "Fix:" in error["message"]
    deep = {"type": "string", "maxLength": LIMITS.max_string_length + 1}
    r = post(served, "/infill", vscode_infill("a", "b", "", [], json_schema=deep))
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("json_schema.maxLength")
    r = post(served, "/completion", {"prompt": "x", "grammar": 'root ::= "a"', "json_schema": {"type": "integer"}})
    assert r.status_code == 400 and "not both" in r.json()["error"]["message"]


@pytest.mark.parametrize("grammar", ['root ::= "a"{5,2}', 'root ::= [a-z]{1,0}', 'root ::= ("ab" | "c"){3,1} "x"'])
@pytest.mark.parametrize("path", ["/completion", "/infill"])
def test_a_grammar_repetition_whose_minimum_passes_its_maximum_is_a_400_before_llama_cpp(served, path, grammar):
    """`x{5,2}` sent llama.cpp's grammar parser into an unbounded allocation: the server process was
    OOM-killed (22 GB) on one request. It is refused before anything parses it, naming the repetition."""
    body = {"prompt": "x", "grammar": grammar} if path == "/completion" else vscode_infill("a", "b", "", [], grammar=grammar)
    r = post(served, path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"].startswith("grammar: "), error
    assert "minimum" in error["message"] and "Fix:" in error["message"], error
    assert request(served.base_url, "GET", "/health").status_code == 200


def _nested_alternatives(n: int) -> str:
    """n**3 parse stacks in ~16n bytes: each alternative of a rule opens every alternative of the rule it names."""
    return "\n".join(["root ::= a", "a ::= " + " | ".join(f'b "{i}"' for i in range(n)),
                      "b ::= " + " | ".join(f'c "{i}"' for i in range(n)), "c ::= " + " | ".join(f'"x{i}"' for i in range(n))])


@pytest.mark.parametrize("grammar", [_nested_alternatives(40), _nested_alternatives(100),
                                     "root ::= " + " | ".join(f'"w{i}"' for i in range(20000))],
                         ids=["40x40x40", "100x100x100", "20000-flat"])
@pytest.mark.parametrize("path", ["/completion", "/infill"])
def test_a_grammar_that_opens_too_many_alternatives_at_once_is_a_400(served, path, grammar):
    """Within the size, rule and nesting bounds, a grammar could still wedge the server: 40 alternatives over 40 over
    40 (1 KB) took llama.cpp 7 s to parse, 100 of each ~25 min, on the one parser thread; 20,000 alternatives in one
    rule stalled every other request ~35 s for a few tokens. Refused before anything parses it, naming the bound."""
    body = {"prompt": "x", "grammar": grammar} if path == "/completion" else vscode_infill("a", "b", "", [], grammar=grammar)
    r = post(served, path, body)
    assert r.status_code == 400, r.text[:500]
    error = r.json()["error"]
    assert error["message"].startswith("grammar: the alternatives open at once in rule"), error
    assert f"limit of {LIMITS.max_grammar_fanout}" in error["message"] and "Fix:" in error["message"], error


def test_grammars_of_schemas_within_the_bounds_open_few_enough_alternatives():
    """The bound leaves the schema path's own grammars alone: max_enum values, side by side four times."""
    from localspec.engine.grammar_limits import check_gbnf
    from localspec.server.translate import JSON_GBNF, schema_grammar

    check_gbnf(JSON_GBNF)
    enums = {"anyOf": [{"enum": [f"v{i}_{j}" for i in range(LIMITS.max_enum)]} for j in range(4)]}
    props = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(LIMITS.max_properties)}}
    for schema in (enums, props):
        check_gbnf(schema_grammar(schema, "x").gbnf)


def test_completion_refuses_token_prompts_and_an_engine_failure_is_an_error_line(served):
    r = post(served, "/completion", {"prompt": [1, 2, 3]})
    assert r.status_code == 400 and "prompt" in r.json()["error"]["message"]
    r = post(served, "/completion", {"prompt": "Break down.", "stream": True})
    last = sse_lines(r.text)[-1]
    assert last["error"]["code"] == 500 and "llama_decode" in last["error"]["message"]
    r = post(served, "/completion", {"prompt": "Break down."})
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"


def test_cutoff_stops_at_the_first_newline_past_t_max_predict_ms():
    """llama-server's t_max_predict_ms: the time runs from the first piece; past it, a piece with a newline
    is the last. (A clock of our own: no test asserts on real time.)"""
    now = [0.0]
    cut = Cutoff(n_indent=0, t_max_predict_ms=100, clock=lambda: now[0])
    assert cut.feed("a = 1\n") == "a = 1\n" and not cut.stopped  # within the time
    now[0] = 0.5
    assert cut.feed("b = ") == "b = " and not cut.stopped  # past it, but no newline yet
    assert cut.feed("2\nc") == "2\nc" and cut.stopped
    assert cut.feed("more") == "" and cut.text == "a = 1\nb = 2\nc"


def test_cutoff_n_indent_keeps_the_short_lines_newline_and_indentation():
    cut = Cutoff(n_indent=4, t_max_predict_ms=0)
    kept = "".join(cut.feed(p) for p in ["  x", " = 1\n", "    y\n", "  \n", "  z", " = 3\n"])
    assert kept == "  x = 1\n    y\n  \n  " and cut.stopped  # the first line and a blank one are not checked


def test_infill_prompt_drops_the_oldest_chunks_and_cuts_prefix_and_suffix_to_fit():
    tok = Tokenizer(encode=lambda text: list(text.encode()), decode=lambda ids: bytes(ids).decode())
    chunks = [ExtraChunk(filename=f"f{i}.py", text=f"chunk {i}\n" * 10) for i in range(5)]
    body = InfillRequest(input_prefix="p" * 50, input_suffix="s" * 50, prompt="x", input_extra=chunks)
    whole = infill_prompt(body, tok, n_ctx=4096, n_predict=64, repo_level=True)
    assert not whole.truncated and all(f"f{i}.py" in whole.text for i in range(5))
    small = infill_prompt(body, tok, n_ctx=400, n_predict=64, repo_level=True)
    assert small.truncated and "f4.py" in small.text and "f0.py" not in small.text  # newest kept
    tight = infill_prompt(body, tok, n_ctx=60, n_predict=20, repo_level=False)
    prefix = tight.text.split("<|fim_prefix|>")[1].split("<|fim_suffix|>")[0]
    suffix = tight.text.split("<|fim_suffix|>")[1].split("<|fim_middle|>")[0]
    assert tight.truncated and prefix.endswith("px") and set(prefix[:-1]) == {"p"} and len(prefix) < 51
    assert suffix == "s" * len(suffix) and len(suffix) < 50 and "chunk" not in tight.text


def test_picked_fields_unnest_paths_and_leave_out_missing_ones():
    answer = {"content": "x", "timings": {"prompt_n": 3}}
    assert picked(answer, ["content", "timings/prompt_n", "timings/nope", "absent", ""]) == {
        "content": "x", "timings/prompt_n": 3}
    assert picked(answer, None) == answer


# ---------------------------------------------------------------- tokens, props, health


def test_tokenize_and_detokenize_round_trip_with_pieces(served):
    r = post(served, "/tokenize", {"content": "hé<|fim_prefix|>", "add_special": False, "parse_special": True})
    assert r.json() == {"tokens": [ord("h"), 0xC3, 0xA9, SPECIAL["<|fim_prefix|>"]]}
    plain = post(served, "/tokenize", {"content": "<|fim_prefix|>", "parse_special": False}).json()["tokens"]
    assert plain == list(b"<|fim_prefix|>")
    pieces = post(served, "/tokenize", {"content": "hé<|fim_prefix|>", "with_pieces": True}).json()["tokens"]
    assert pieces == [{"id": 104, "piece": "h"}, {"id": 0xC3, "piece": [0xC3]}, {"id": 0xA9, "piece": [0xA9]},
                      {"id": SPECIAL["<|fim_prefix|>"], "piece": "<|fim_prefix|>"}]
    r = post(served, "/detokenize", {"tokens": [ord("h"), 0xC3, 0xA9]})
    assert r.json() == {"content": "hé"}
    r = post(served, "/detokenize", {"tokens": [1, 10**9]})
    assert r.status_code == 400 and "1000000000" in r.json()["error"]["message"]
    r = post(served, "/detokenize", {"tokens": [-1]})
    assert r.status_code == 400


def test_apply_template_answers_the_prompt_a_chat_request_decodes_from(served):
    """The chat template's text, the assistant's turn opened: the very text the model reads for the same messages
    on /v1/chat/completions. A message that spells a special token is in it as it was written."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello twice."}]
    r = post(served, "/apply-template", {"messages": messages})
    assert r.status_code == 200, r.text
    prompt = r.json()["prompt"]
    assert r.json() == {"prompt": prompt} and prompt.endswith("<|im_start|>assistant\n")
    chat = post(served, "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 8})
    assert chat.status_code == 200, chat.text
    assert PROMPTS[-1] == prompt and "<|im_start|>user\nSay hello twice.<|im_end|>" in prompt
    spelled = [{"role": "user", "content": "Say <|fim_prefix|> twice."}]
    prompt = post(served, "/apply-template", {"messages": spelled}).json()["prompt"]
    assert prompt == "<|im_start|>user\nSay <|fim_prefix|> twice.<|im_end|>\n<|im_start|>assistant\n"
    prefilled = [*messages, {"role": "assistant", "content": "Hello, hel"}]  # continued, as a chat request's is
    prompt = post(served, "/apply-template", {"messages": prefilled}).json()["prompt"]
    assert prompt == post(served, "/apply-template", {"messages": messages}).json()["prompt"] + "Hello, hel"
    for bad in ({"messages": []}, {"messages": [{"role": "robot", "content": "hi"}]}, {}):
        r = post(served, "/apply-template", bad)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", (bad, r.text)
    r = post(served, "/apply-template", {"messages": messages, "model": "nope"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


@pytest.mark.parametrize("only", [[{"role": "assistant", "content": "Once upon"}],
                                  [{"role": "assistant", "content": [{"type": "text", "text": "Once upon"}]}]])
def test_apply_template_refuses_a_prefill_with_nothing_before_it_as_a_chat_request_does(served, only):
    """A conversation that is only the assistant's prefill was the template's own failure ("list object has no element
    0" from Qwen's) on /apply-template, or a prompt no chat request decodes from: the chat routes' 400, named."""
    chat = post(served, "/v1/chat/completions", {"model": MODEL, "messages": only, "max_tokens": 8})
    r = post(served, "/apply-template", {"messages": only})
    assert chat.status_code == 400 and r.status_code == 400, (chat.text, r.text)
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"] == chat.json()["error"]["message"], error
    assert "no message comes before it" in error["message"] and "Fix:" in error["message"]


def test_props_says_the_context_slots_and_model_file_by_name(served):
    r = request(served.base_url, "GET", "/props")
    assert r.status_code == 200, r.text
    props = r.json()
    assert props["default_generation_settings"]["n_ctx"] == served.tier.engine.target.n_ctx_seq
    assert props["total_slots"] == 4 and props["model_path"] == "scripted-coder.gguf" and "/" not in props["model_path"]
    assert request(served.base_url, "GET", f"/props?model={MODEL}").json()["model_alias"] == MODEL
    assert request(served.base_url, "GET", "/props?model=nope").status_code == 404


def test_health_has_the_status_llama_vscode_reads(served):
    """llama.vscode's health check reads `status` and wants "ok"; ours is a superset that names the server."""
    body = request(served.base_url, "GET", "/health").json()
    assert body["status"] == "ok" and body["server"] == "localspec"


def test_the_routes_document_llama_servers_error_shape(served):
    spec = request(served.base_url, "GET", "/openapi.json").json()
    for path in ("/completion", "/infill", "/tokenize", "/detokenize", "/apply-template"):
        ref = spec["paths"][path]["post"]["responses"]["400"]["content"]["application/json"]["schema"]["$ref"]
        assert ref.endswith("/LlamaCppError"), path
    assert "/props" in spec["paths"]


def test_the_fanout_estimate_never_fails_on_grammars_nested_to_the_bounds():
    """Groups nested to max_grammar_depth, or rules naming the next 5,000 deep, pass the estimate (past Python's
    recursion limit it is skipped): a RecursionError out of check_gbnf was a 500 on /completion."""
    from localspec.engine.grammar_limits import check_gbnf

    depth = LIMITS.max_grammar_depth - 1
    check_gbnf("root ::= " + "(" * depth + '"a" | "b"' + ")" * depth)
    check_gbnf("\n".join(f'r{i} ::= r{i + 1} | "x"' for i in range(5000)) + '\nroot ::= r0\nr5000 ::= "y"')
