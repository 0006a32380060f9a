"""`n` choices on /v1/chat/completions and /v1/completions: a real server on loopback, a scripted
model (tests/fake_tier.py), the official `openai` client.

Each choice is its own engine job; with a seed, choice i samples with seed + i. The scripted model's
"unsure" answer puts a logit of 1 on its next byte and 0 on every other token, so a sampled draw is
close to uniform: different seeds give different texts, one seed gives one text. What a real model
does with n is checked in test_server.py (`model_client`).
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict

import openai
import pytest

from localspec.cache import SemanticCache
from localspec.pipeline import PipelineSettings
from localspec.server import ServerSettings
from localspec.server.ollama import OllamaChatRequest, chat_request
from localspec.server.responses import ResponsesRequest, as_chat, input_messages
from tests.fake_tier import Reply, ScriptedEmbedder, scripted_app, scripted_pipeline, scripted_tier
from tests.server_harness import OpenStream, ServerThread, refuse_after, request, wait_until

MODEL = "scripted-choices"
PARALLEL = 3
CAP = 256
TWO_CALLS = "".join(f'<tool_call>\n{{"name": "weather", "arguments": {{"city": "{c}"}}}}\n</tool_call>\n'
                    for c in ("Paris", "Rome"))
WEATHER = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]


def script(prompt: str) -> Reply | str:
    if "Pick anything" in prompt:
        return Reply("abcdefghijklmnop", confidence=1.0)  # an unsure model: a sampled draw is near uniform
    if "Count slowly" in prompt:
        return Reply("one two three four five six seven eight nine ten", pace_s=0.01)  # the choices overlap
    if "Talk forever" in prompt:
        return Reply("and on " * 200, pace_s=0.05)  # still decoding when the client leaves (CAP tokens: 12 s)
    if "Look up two cities" in prompt:
        return TWO_CALLS
    if "Break down" in prompt:
        return Reply("Never said.", fail="llama_decode returned -3")
    return "Red, green, blue. Yes."


@pytest.fixture(scope="module")
def srv(module_home, tmp_path_factory):
    cache = SemanticCache(tmp_path_factory.mktemp("cache"), embedder=ScriptedEmbedder())
    tier = scripted_tier(model_id=MODEL, script=script, parallel=PARALLEL)
    pipeline = scripted_pipeline(tiers=[tier], cache=cache, settings=PipelineSettings(cache_judge="rules"))
    jobs: list = []
    submit = pipeline.submit

    def recorded(*args, **kwargs):  # every job the server starts, to see how each one ended
        job = submit(*args, **kwargs)
        jobs.append(job)
        return job

    pipeline.submit = recorded
    settings = ServerSettings(parallel=PARALLEL, max_tokens_cap=CAP, cache_judge=False)
    app = scripted_app(pipeline=pipeline, settings=settings)
    with ServerThread(app) as server:
        assert wait_until(lambda: request(server.base_url, "GET", "/health").status_code == 200, timeout=60)
        server.jobs = jobs
        server.engine = tier.engine
        yield server


@pytest.fixture
def client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def texts(reply) -> list[str]:
    return [c.message.content for c in reply.choices]


def by_index(chunks) -> dict[int, list]:
    out: dict[int, list] = defaultdict(list)
    for chunk in chunks:
        for choice in chunk.choices:
            out[choice.index].append(choice)
    return out


# ---------------------------------------------------------------- whole answers


def test_n_choices_are_indexed_and_usage_counts_the_prompt_once(client):
    one = client.chat.completions.create(model=MODEL, messages=user("Say hi."), temperature=0)
    three = client.chat.completions.create(model=MODEL, messages=user("Say hi."), temperature=0, n=3)
    assert [c.index for c in three.choices] == [0, 1, 2]
    # Greedy choices are the same answer, as OpenAI's are at temperature 0: each was decoded on its own.
    assert texts(three) == texts(one) * 3 and all(c.finish_reason == "stop" for c in three.choices)
    # OpenAI's usage: the prompt once, every choice's completion tokens summed.
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    assert three.usage.completion_tokens == 3 * one.usage.completion_tokens
    assert three.usage.total_tokens == three.usage.prompt_tokens + three.usage.completion_tokens
    # The localspec object is choice 0's, as with n=1, and lists every choice's own.
    ext = three.model_extra["localspec"]
    assert len(ext["choices"]) == 3 and all(c["mode"] == ext["mode"] for c in ext["choices"])
    assert {k: v for k, v in ext.items() if k != "choices"} == ext["choices"][0]
    assert "choices" not in one.model_extra["localspec"]  # a one-choice answer is as it was


def test_seeded_choices_differ_and_choice_i_is_seed_plus_i(client):
    ask = dict(model=MODEL, messages=user("Pick anything."), temperature=1.0, max_tokens=8)
    three = client.chat.completions.create(n=3, seed=7, **ask)
    assert len(set(texts(three))) == 3, texts(three)
    assert texts(client.chat.completions.create(n=3, seed=7, **ask)) == texts(three)  # reproducible
    # Choice i is what n=1 with seed + i answers.
    assert [texts(client.chat.completions.create(seed=7 + i, **ask))[0] for i in range(3)] == texts(three)


def test_unseeded_choices_each_draw_their_own(client):
    three = client.chat.completions.create(model=MODEL, messages=user("Pick anything."), temperature=1.0,
                                           max_tokens=8, n=3)
    assert len(set(texts(three))) == 3, texts(three)


def test_each_choice_has_its_own_tool_calls_and_logprobs(client):
    r = client.chat.completions.create(model=MODEL, messages=user("Look up two cities."), tools=WEATHER,
                                       temperature=0, n=2)
    for c in r.choices:
        assert c.finish_reason == "tool_calls"
        assert [json.loads(t.function.arguments)["city"] for t in c.message.tool_calls] == ["Paris", "Rome"]
    assert r.choices[0].message.tool_calls[0].id != r.choices[1].message.tool_calls[0].id
    r = client.chat.completions.create(model=MODEL, messages=user("Pick anything."), temperature=1.0, seed=3,
                                       max_tokens=6, n=2, logprobs=True)
    assert [len(c.logprobs.content) for c in r.choices] == [6, 6]
    assert [t.token for t in r.choices[0].logprobs.content] != [t.token for t in r.choices[1].logprobs.content]


def test_several_choices_bypass_the_cache_and_say_why(client):
    ask = dict(model=MODEL, messages=user("Pick anything, cached."), temperature=1.0, seed=11, max_tokens=8)
    two = client.chat.completions.create(n=2, **ask)
    verdict = two.model_extra["localspec"]["cache"]
    assert verdict["status"] == "bypass" and "n=2" in verdict["reason"], verdict
    assert all(c["cache"]["status"] == "bypass" for c in two.model_extra["localspec"]["choices"])
    # Nothing was stored: the same request with n=1 is a miss, then a hit; n=2 still generates.
    assert client.chat.completions.create(**ask).model_extra["localspec"]["cache"]["status"] == "miss"
    assert client.chat.completions.create(**ask).model_extra["localspec"]["cache"]["status"] == "hit"
    again = client.chat.completions.create(n=2, **ask)
    assert again.model_extra["localspec"]["cache"]["status"] == "bypass" and texts(again) == texts(two)
    # The request's own opt-out keeps its own reason.
    off = client.chat.completions.create(n=2, extra_body={"localspec": {"cache": False}}, **ask)
    assert off.model_extra["localspec"]["cache"]["reason"] == "disabled for this request"


@pytest.mark.parametrize("n", [0, PARALLEL + 1])
def test_n_outside_one_to_parallel_is_a_400_naming_n_and_parallel(srv, n):
    for path, body in (("/v1/chat/completions", {"messages": user("hi")}), ("/v1/completions", {"prompt": "hi"})):
        r = request(srv.base_url, "POST", path, json_body={"model": MODEL, "n": n, **body})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "n" and err["code"] == "invalid_value" and f"n={n}" in err["message"]
        if n > PARALLEL:
            assert f"--parallel {PARALLEL}" in err["message"] and "larger --parallel" in err["message"]


def test_a_choice_refused_by_admission_cancels_those_already_submitted(srv, monkeypatch):
    """n=3 and the queue full at the third: a 429, and the two admitted would answer nobody."""
    submitted = refuse_after(srv.app.state.server, monkeypatch, admitted=2)
    r = request(srv.base_url, "POST", "/v1/chat/completions",
                json_body={"model": MODEL, "messages": user("Talk forever."), "n": 3, "max_tokens": CAP})
    assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full", r.text
    assert len(submitted) == 2 and all(job.cancelled for job in submitted)
    assert wait_until(lambda: all(job.done.is_set() for job in submitted), timeout=60)
    assert [job.result.finish_reason for job in submitted] == ["cancelled"] * 2


def test_a_failed_choice_fails_the_answer_in_openais_error_shape(srv, client):
    with pytest.raises(openai.InternalServerError, match="llama_decode returned -3"):
        client.chat.completions.create(model=MODEL, messages=user("Break down."), n=2)
    chunks = request(srv.base_url, "POST", "/v1/chat/completions",
                     json_body={"model": MODEL, "messages": user("Break down."), "n": 2, "stream": True}).text
    events = [line.removeprefix("data: ") for line in chunks.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and "llama_decode returned -3" in json.loads(events[-2])["error"]["message"]
    assert texts(client.chat.completions.create(model=MODEL, messages=user("Say hi."), n=2)) == \
        ["Red, green, blue. Yes."] * 2  # the server goes on


# ---------------------------------------------------------------- streamed


def test_streamed_choices_interleave_and_reassemble_to_the_whole_answers(client):
    ask = dict(model=MODEL, messages=user("Count slowly."), temperature=0, n=3)
    whole = client.chat.completions.create(**ask)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **ask))
    assert len({c.id for c in chunks}) == 1
    per = by_index(c for c in chunks if c.choices)
    assert sorted(per) == [0, 1, 2]
    for i, choices in per.items():
        assert choices[0].delta.role == "assistant"
        assert "".join(c.delta.content or "" for c in choices) == whole.choices[i].message.content
        finals = [c for c in choices if c.finish_reason]
        assert len(finals) == 1 and finals[0] is choices[-1] and finals[0].finish_reason == "stop"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert all(f.model_extra["localspec"]["mode"] for f in finals)  # each choice's own extension
    # The slots decode the choices together: their chunks come interleaved, not one choice after another.
    order = [c.choices[0].index for c in chunks if c.choices and c.choices[0].delta.content]
    assert order != sorted(order), order
    usage = [c for c in chunks if c.usage is not None]
    assert len(usage) == 1 and usage[0] is chunks[-1] and not usage[0].choices
    assert usage[0].usage.model_dump() == whole.usage.model_dump()


def test_streamed_seeded_choices_match_the_whole_ones(client):
    ask = dict(model=MODEL, messages=user("Pick anything."), temperature=1.0, seed=21, max_tokens=8, n=2)
    whole = client.chat.completions.create(**ask)
    per = by_index(client.chat.completions.create(stream=True, **ask))
    assert ["".join(c.delta.content or "" for c in per[i]) for i in (0, 1)] == texts(whole)


def test_streamed_choices_carry_their_own_tool_calls(client):
    chunks = list(client.chat.completions.create(model=MODEL, messages=user("Look up two cities."), tools=WEATHER,
                                                 temperature=0, n=2, stream=True))
    for i, choices in by_index(chunks).items():
        calls = [d for c in choices for d in c.delta.tool_calls or []]
        assert [json.loads(d.function.arguments)["city"] for d in calls] == ["Paris", "Rome"], i
        assert choices[-1].finish_reason == "tool_calls"


def test_a_client_leaving_a_stream_cancels_every_choice(srv):
    seen = len(srv.jobs)
    stream = OpenStream(srv.base_url, "/v1/chat/completions", "unused",
                        {"model": MODEL, "messages": user("Talk forever."), "n": PARALLEL, "stream": True,
                         "max_tokens": CAP})
    got: set[int] = set()
    for line in stream.lines():  # until every choice has sent text
        if line.startswith("data: {"):
            chunk = json.loads(line.removeprefix("data: "))
            got.update(c["index"] for c in chunk["choices"] if c["delta"].get("content"))
            if len(got) == PARALLEL:
                break
    stream.close()
    jobs = srv.jobs[seen:]
    assert len(jobs) == PARALLEL
    assert wait_until(lambda: all(j.done.is_set() for j in jobs), timeout=60)
    assert [j.result.finish_reason for j in jobs] == ["cancelled"] * PARALLEL


def test_a_client_leaving_a_whole_answer_cancels_every_choice(srv):
    seen = len(srv.jobs)
    done = threading.Event()

    def ask() -> None:
        try:
            request(srv.base_url, "POST", "/v1/chat/completions", timeout=2,
                    json_body={"model": MODEL, "messages": user("Talk forever."), "n": 2, "max_tokens": CAP})
        except OSError:  # our own timeout: the client gives up and closes the connection
            pass
        done.set()

    threading.Thread(target=ask, daemon=True).start()
    assert wait_until(lambda: len(srv.jobs) >= seen + 2, timeout=60)
    assert done.wait(60)
    jobs = srv.jobs[seen:seen + 2]
    assert wait_until(lambda: all(j.done.is_set() for j in jobs), timeout=60)
    assert [j.result.finish_reason for j in jobs] == ["cancelled"] * 2


# ---------------------------------------------------------------- /v1/completions


def test_completions_serve_n_choices_whole_and_streamed(client):
    ask = dict(model=MODEL, prompt="Say hi.", temperature=0, max_tokens=16, echo=True, logprobs=1)
    one = client.completions.create(**ask)
    two = client.completions.create(n=2, **ask)
    assert [c.index for c in two.choices] == [0, 1]
    assert [c.text for c in two.choices] == [one.choices[0].text] * 2 and one.choices[0].text.startswith("Say hi.")
    assert [c.logprobs.tokens for c in two.choices] == [one.choices[0].logprobs.tokens] * 2
    assert two.usage.prompt_tokens == one.usage.prompt_tokens
    assert two.usage.completion_tokens == 2 * one.usage.completion_tokens
    assert len(two.model_extra["localspec"]["choices"]) == 2 and "choices" not in one.model_extra["localspec"]
    chunks = list(client.completions.create(n=2, stream=True, stream_options={"include_usage": True}, **ask))
    per = by_index(c for c in chunks if c.choices)
    assert ["".join(c.text for c in per[i]) for i in (0, 1)] == [c.text for c in two.choices]
    assert [sum(1 for c in per[i] if c.finish_reason) for i in (0, 1)] == [1, 1]
    assert chunks[-1].usage.model_dump() == two.usage.model_dump() and not chunks[-1].choices


def test_completions_seeded_choices_are_seed_plus_i(client):
    ask = dict(model=MODEL, prompt="Pick anything.", temperature=1.0, max_tokens=8)
    two = client.completions.create(n=2, seed=5, **ask)
    assert [client.completions.create(seed=5 + i, **ask).choices[0].text for i in (0, 1)] == \
        [c.text for c in two.choices]
    assert two.choices[0].text != two.choices[1].text


def test_best_of_stays_refused(srv):
    r = request(srv.base_url, "POST", "/v1/completions",
                json_body={"model": MODEL, "prompt": "Say hi.", "n": 2, "best_of": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "best_of", r.text


# ---------------------------------------------------------------- the other faces


def test_the_responses_and_ollama_faces_build_one_choice():
    """Their requests have no `n`: one sent anyway is an unknown field, and their chat request asks for one."""
    body = ResponsesRequest.model_validate({"model": MODEL, "input": "hi", "n": 3})
    assert as_chat(body, input_messages(body, referenced=lambda _: None)).n == 1
    ollama = OllamaChatRequest.model_validate({"model": MODEL, "messages": user("hi"), "n": 3,
                                                "options": {"n": 3, "seed": 4}})
    assert chat_request(ollama).n == 1
