"""The endpoint with `--cache-judge scorer`: near-duplicates confirmed by the pair scorer, through `openai`.

A real server on loopback with the 0.5B model and MiniLM. The scorer's verdict and its name come back
in the reply's `localspec.cache` object; a paraphrase asked again is served from the remembered yes.
"""

from __future__ import annotations

import openai
import pydantic
import pytest

from localspec.cache.scorer import PairScorer
from localspec.server import ServerSettings, create_app
from tests.common import DRAFT_ID, TEST_THREADS
from tests.server_harness import ServerThread, request, wait_until


@pytest.fixture(scope="module")
def srv(draft_path, minilm_path, module_home):
    settings = ServerSettings(target=DRAFT_ID, mode="off", parallel=1, n_ctx=1024, n_threads=TEST_THREADS,
                              max_tokens_cap=64, cache_semantic=True, cache_judge="scorer")
    with ServerThread(create_app(settings)) as server:
        assert wait_until(lambda: request(server.base_url, "GET", "/health").status_code == 200, timeout=300), (
            request(server.base_url, "GET", "/health").text
        )
        yield server


def ask(client: openai.OpenAI, text: str):
    reply = client.chat.completions.create(model=DRAFT_ID, messages=[{"role": "user", "content": text}],
                                           max_tokens=8, temperature=0)
    return reply, reply.model_extra["localspec"]["cache"]


def test_the_scorer_serves_a_rewording_remembers_it_and_refuses_a_trap(srv) -> None:
    client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
    first, c = ask(client, "How do I reverse a list in Python?")
    assert c["status"] == "miss"
    para, c = ask(client, "How can I reverse a list in Python?")
    assert c["status"] == "hit" and c["kind"] == "semantic", c
    assert c["judged_by"].startswith("pair-scorer:") and c["judge"] >= PairScorer.load().threshold
    assert c["matched_prompt"] == "How do I reverse a list in Python?" and "remembered" not in c
    assert para.choices[0].message.content == first.choices[0].message.content
    _, c = ask(client, "How can I reverse a list in Python?")
    assert c["status"] == "hit" and c["remembered"] is True
    ask(client, "How do I delete a git branch?")
    _, c = ask(client, "How do I delete a remote git branch?")  # similar enough and the guard passes it
    assert c["status"] == "miss", c
    stats = request(srv.base_url, "GET", "/v1/cache/stats").json()
    assert stats["judged"] == 2 and stats["judge_rejections"] == 1 and stats["remembered_verdicts"] == 1
    assert stats["judge"].startswith("pair-scorer:")


def test_settings_take_the_judge_by_name_or_the_older_switch() -> None:
    assert ServerSettings(cache_judge="scorer").cache_judge == "scorer"
    assert ServerSettings(cache_judge=True).cache_judge == "model"
    assert ServerSettings(cache_judge=False).cache_judge == "rules"
    with pytest.raises(pydantic.ValidationError):
        ServerSettings(cache_judge="oracle")


def test_the_command_line_offers_the_same_judges_as_the_cache() -> None:
    from localspec.cache.policy import CACHE_JUDGES
    from localspec.cli.options import CACHE_JUDGES as OFFERED

    assert OFFERED == CACHE_JUDGES


def test_serve_and_chat_parse_the_judge() -> None:
    from localspec.cli import build_parser
    from localspec.cli.chat_cmd import chat_cache
    from localspec.cli.serve_cmd import settings_from_args

    parser = build_parser()
    for flags, expected in (([], "model"), (["--cache-judge", "scorer"], "scorer"), (["--no-cache-judge"], "rules")):
        assert settings_from_args(parser.parse_args(["serve", *flags])).cache_judge == expected
        assert chat_cache(parser.parse_args(["chat", *flags])).judge == expected  # flag, else [cache] judge
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--cache-judge", "oracle"])
