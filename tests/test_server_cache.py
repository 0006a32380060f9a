"""The semantic cache through the endpoint: a real server on loopback, a scripted model and scripted
embeddings (tests/fake_tier.py), `openai`.

A repeated deterministic request is answered from the cache and marked so in the response's
`localspec.cache` object; near-duplicates hit only when the guard agrees; scope, sampling and the
per-request switch keep the rest out; "mark wrong" evicts. The reuse judge is off here (rules);
tests/test_cache_semantic.py checks the guard on MiniLM's real vectors, tests/test_cache_judge.py
drives a judged server with the 1.5B.
"""

from __future__ import annotations

import openai
import pytest

from localspec.cache import SemanticCache
from localspec.pipeline import PipelineSettings
from localspec.server import ServerSettings
from tests.fake_tier import ScriptedEmbedder, echo, scripted_app, scripted_pipeline, scripted_tier
from tests.server_harness import ServerThread, request, wait_until

MODEL = "scripted-large"
# Near neighbours for the embedder: a paraphrase, and a trap the guard must refuse however close.
NEIGHBOURS = [
    ["How do I reverse a list in Python?", "How can I reverse a list in Python?"],
    ["How do I sort a list in ascending order in Python?", "How do I sort a list in descending order in Python?"],
]


@pytest.fixture(scope="module")
def srv(module_home, tmp_path_factory):
    cache = SemanticCache(tmp_path_factory.mktemp("cache"), embedder=ScriptedEmbedder(NEIGHBOURS))
    pipeline = scripted_pipeline(tiers=[scripted_tier(model_id=MODEL, script=echo())], cache=cache,
                                 settings=PipelineSettings(cache_judge="rules"))
    settings = ServerSettings(parallel=2, max_tokens_cap=64, cache_semantic=True, cache_judge=False)
    with ServerThread(scripted_app(pipeline=pipeline, settings=settings)) as server:
        assert wait_until(lambda: request(server.base_url, "GET", "/health").status_code == 200, timeout=60), (
            request(server.base_url, "GET", "/health").text
        )
        yield server


@pytest.fixture
def client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0, timeout=300)


def ask(client, text: str, system: str | None = None, history: list[dict] | None = None, **kw):
    messages = ([{"role": "system", "content": system}] if system else []) + (history or [])
    messages.append({"role": "user", "content": text})
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=48, **kw)


def cache_of(reply) -> dict:
    return reply.model_extra["localspec"]["cache"]


def test_repeated_request_is_answered_from_the_cache(client):
    first = ask(client, "What is the capital of France? One word.")
    assert cache_of(first)["status"] == "miss"
    second = ask(client, "What is the capital of France? One word.")
    ext = second.model_extra["localspec"]
    assert ext["cache"]["status"] == "hit" and ext["cache"]["kind"] == "exact"
    assert ext["cache"]["matched_prompt"] == "What is the capital of France? One word."
    assert ext["mode"] == "cache" and ext["drafted"] == 0
    assert second.choices[0].message.content == first.choices[0].message.content
    assert second.usage.completion_tokens == first.usage.completion_tokens


def test_a_hit_streams_like_a_generation(client):
    first = ask(client, "Name a primary colour. One word.")
    chunks = list(ask(client, "Name a primary colour. One word.", stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == first.choices[0].message.content
    final = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(final) == 1 and final[0].model_extra["localspec"]["cache"]["status"] == "hit"


def test_a_hit_says_which_stop_string_ended_the_answer(srv):
    """llama-server's `stop_type`/`stopping_word` on a repeat answered from the cache: the stop string the
    generation met (a hit said "eos", an end token, for every answer)."""
    body = {"prompt": "Count: one two three", "n_predict": 48, "temperature": 0, "stop": ["two"]}
    answers = [request(srv.base_url, "POST", "/completion", json_body=body).json() for _ in range(2)]
    assert answers[0]["content"] == answers[1]["content"] == "You said: Count: one "
    assert answers[1]["timings"]["predicted_ms"] == 0  # the cache's: no decoding
    for answer in answers:
        assert answer["stop_type"] == "word" and answer["stopping_word"] == "two", answer


def test_a_paraphrase_hits_semantically_and_a_trap_does_not(client):
    ask(client, "How do I reverse a list in Python?")
    para = ask(client, "How can I reverse a list in Python?")
    c = cache_of(para)
    assert c["status"] == "hit" and c["kind"] == "semantic", c
    assert 0 < c["similarity"] < 1 and c["matched_prompt"] == "How do I reverse a list in Python?"

    ask(client, "How do I sort a list in ascending order in Python?")
    trap = ask(client, "How do I sort a list in descending order in Python?")
    assert cache_of(trap)["status"] == "miss"


def test_scope_system_prompt_and_earlier_turns(client):
    ask(client, "Say hello.", system="You are terse.")
    assert cache_of(ask(client, "Say hello.", system="You are terse."))["status"] == "hit"
    assert cache_of(ask(client, "Say hello.", system="You are a pirate."))["status"] == "miss"
    history = [{"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": "Hi Ada."}]
    assert cache_of(ask(client, "Say hello.", system="You are terse.", history=history))["status"] == "miss"


def test_a_prefilled_request_and_one_without_never_share_an_entry(client):
    """A prefill's answer continues it: served the question's cached answer, it repeated what the
    client wrote; cached, it served a question its continuation does not answer. An empty final
    assistant message continues nothing: the question's own entry."""
    def prefilled(text: str, prefill: str):
        return client.chat.completions.create(model=MODEL, max_tokens=48, temperature=0, messages=[
            {"role": "user", "content": text}, {"role": "assistant", "content": prefill}])

    assert cache_of(ask(client, "Name a planet."))["status"] == "miss"
    after = cache_of(prefilled("Name a planet.", "You said"))
    assert after["status"] == "bypass" and "prefill" in after["reason"], after
    before = cache_of(prefilled("Name a moon.", "You said"))
    assert before["status"] == "bypass" and "prefill" in before["reason"], before
    assert cache_of(ask(client, "Name a moon."))["status"] == "miss"
    assert cache_of(prefilled("Name a planet.", ""))["status"] == "hit"


def test_sampled_requests_and_the_opt_out_bypass_the_cache(client):
    # The endpoint's default temperature is OpenAI's 1.0: without a seed that is a sampled draw.
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Pick a number."}],
                                       max_tokens=4)
    assert cache_of(r)["status"] == "bypass" and "sampled" in cache_of(r)["reason"]
    seeded = dict(temperature=0.9, seed=7)
    ask(client, "Pick a fruit.", **seeded)
    assert cache_of(ask(client, "Pick a fruit.", **seeded))["status"] == "hit"
    ask(client, "Pick a vegetable.")
    off = ask(client, "Pick a vegetable.", extra_body={"localspec": {"cache": False}})
    assert cache_of(off)["status"] == "bypass"


def test_mark_wrong_evicts_and_counts_a_false_hit(srv, client):
    ask(client, "What is 2 + 2? Answer with a digit.")
    hit = ask(client, "What is 2 + 2? Answer with a digit.")
    entry, token = cache_of(hit)["entry_id"], cache_of(hit)["verdict_token"]
    before = request(srv.base_url, "GET", "/v1/cache/stats").json()["false_hits"]
    # The entry id alone is not enough: eviction takes the token of the response that served it.
    assert request(srv.base_url, "POST", f"/v1/cache/{entry}/wrong", json_body={"token": "0" * 32}).status_code == 403
    assert request(srv.base_url, "POST", f"/v1/cache/{entry}/wrong").status_code == 400
    r = request(srv.base_url, "POST", f"/v1/cache/{entry}/wrong", json_body={"token": token})
    assert r.status_code == 200 and r.json() == {"entry_id": entry, "evicted": True}
    assert request(srv.base_url, "GET", "/v1/cache/stats").json()["false_hits"] == before + 1
    again = request(srv.base_url, "POST", f"/v1/cache/{entry}/wrong", json_body={"token": token})
    assert again.status_code == 404  # already gone, and not counted twice
    assert request(srv.base_url, "GET", "/v1/cache/stats").json()["false_hits"] == before + 1
    assert cache_of(ask(client, "What is 2 + 2? Answer with a digit."))["status"] == "miss"
    bad = request(srv.base_url, "POST", "/v1/cache/..%2F..%2Fetc/wrong", json_body={"token": token})
    assert bad.status_code in (400, 404) and "Traceback" not in bad.text


def test_cache_stats_report_the_semantic_mode(srv):
    stats = request(srv.base_url, "GET", "/v1/cache/stats").json()
    assert stats["mode"] == "semantic" and stats["entries"] >= 1 and stats["exact_hits"] >= 1
    assert "directory" not in stats and "/" not in stats["detail"] + stats["description"]  # no paths over HTTP
    assert stats["judge"] == "rules"  # started with cache_judge=False
