"""Whose cached answers a client sees: each API key has its own cache, and eviction takes the token of
the response that served the entry. A real server with two keys, a scripted model (tests/fake_tier.py),
the `openai` client."""

from __future__ import annotations

import openai
import pytest

from localspec.cache import SemanticCache
from localspec.server import ServerSettings
from tests.fake_tier import echo, scripted_app, scripted_pipeline, scripted_tier
from tests.server_harness import ServerThread, request, wait_until

MODEL = "scripted-large"

ALICE, BOB = "alice-key-0123456789", "bob-key-9876543210"


@pytest.fixture(scope="module")
def srv(module_home, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "api-keys"
    keys.write_text(f"# two users\n{ALICE}\n{BOB}\n")
    keys.chmod(0o600)
    settings = ServerSettings(parallel=2, max_tokens_cap=16, api_key_file=keys, router=False)
    cache = SemanticCache(tmp_path_factory.mktemp("cache"), embedder=None)  # exact matches: the profile's default
    pipeline = scripted_pipeline(tiers=[scripted_tier(model_id=MODEL, script=echo())], cache=cache)
    with ServerThread(scripted_app(pipeline=pipeline, settings=settings)) as server:
        assert wait_until(lambda: request(server.base_url, "GET", "/health").status_code == 200, timeout=60)
        yield server


def ask(srv, key: str, text: str):
    client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key=key, max_retries=0, timeout=300)
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}],
                                           max_tokens=6, temperature=0)
    return reply.model_extra["localspec"]["cache"]


def test_each_key_has_its_own_cache_and_never_sees_anothers_prompt(srv):
    prompt = "Alice's private question: what is 3 + 4? One digit."
    assert ask(srv, ALICE, prompt)["status"] == "miss"
    alice_hit = ask(srv, ALICE, prompt)
    assert alice_hit["status"] == "hit" and alice_hit["matched_prompt"] == prompt
    bob = ask(srv, BOB, prompt)  # the same words from another key: not Alice's entry
    assert bob["status"] == "miss" and "matched_prompt" not in bob


def test_only_the_owner_can_mark_an_entry_wrong(srv):
    prompt = "Name one planet. One word."
    ask(srv, ALICE, prompt)
    hit = ask(srv, ALICE, prompt)
    entry, token = hit["entry_id"], hit["verdict_token"]
    # Bob knows the entry id and even Alice's token: with his key, neither evicts it.
    for body in ({"token": token}, {"token": "0" * 32}):
        r = request(srv.base_url, "POST", f"/v1/cache/{entry}/wrong", key=BOB, json_body=body)
        assert r.status_code == 403 and r.json()["error"]["code"] == "invalid_token"
    assert ask(srv, ALICE, prompt)["status"] == "hit"
    r = request(srv.base_url, "POST", f"/v1/cache/{entry}/wrong", key=ALICE, json_body={"token": token})
    assert r.status_code == 200 and r.json()["evicted"] is True
    assert ask(srv, ALICE, prompt)["status"] == "miss"


def test_tokens_differ_per_key_for_the_same_words(srv):
    prompt = "Say yes. One word."
    for key in (ALICE, BOB):
        ask(srv, key, prompt)
    a, b = ask(srv, ALICE, prompt), ask(srv, BOB, prompt)
    assert a["status"] == b["status"] == "hit"
    assert a["entry_id"] != b["entry_id"] and a["verdict_token"] != b["verdict_token"]
