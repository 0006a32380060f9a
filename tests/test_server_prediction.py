"""Predicted Outputs through the endpoint: `prediction` on /v1/chat/completions and /v1/completions,
usage's completion_tokens_details, the 400s, the combinations, the cache and the remote tier.

A real server on loopback answers from a scripted model (tests/fake_tier.py) through the official
`openai` client; the last test runs the real target (stage 2) and checks the greedy text is the
same with and without a prediction.
"""

from __future__ import annotations

import threading

import openai
import pytest

from localspec.cache import SemanticCache
from localspec.engine.config import GenerationRequest
from localspec.engine.events import Done
from localspec.pipeline import PipelineSettings, RemoteRunner
from localspec.router import RemoteTier, TierSpec
from localspec.server import ServerSettings, create_app
from tests.common import TARGET_ID, TEST_THREADS
from tests.fake_tier import ScriptedEmbedder, scripted, scripted_app, scripted_pipeline, scripted_tier
from tests.server_harness import ServerThread, request, wait_until

MODEL = "scripted-large"
FILE = "def area(width, height):\n    return width * height\n\n\nprint(area(2, 3))\n"
EDITED = FILE.replace("area(width, height):", "area(width: float, height: float) -> float:")
SCRIPT = scripted({"Add type hints": EDITED, "Say yes": "Yes."}, default="OK.")
N_CTX = 512


@pytest.fixture(scope="module")
def srv(module_home):
    tier = scripted_tier(model_id=MODEL, script=SCRIPT, mode="lookup", parallel=2, n_ctx=N_CTX)
    settings = ServerSettings(parallel=2, max_tokens_cap=256, n_ctx=N_CTX, cache=False, router=False)
    with ServerThread(scripted_app(pipeline=scripted_pipeline(tiers=[tier]), settings=settings)) as server:
        assert wait_until(lambda: request(server.base_url, "GET", "/health").status_code == 200, timeout=60)
        yield server


@pytest.fixture
def client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def edit(client, prediction=None, **kw):
    kw.setdefault("temperature", 0)
    if prediction is not None:
        kw["prediction"] = {"type": "content", "content": prediction}
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"Add type hints to:\n{FILE}"}], max_tokens=200, **kw)


def details(usage) -> tuple[int, int]:
    d = usage.completion_tokens_details
    return d.accepted_prediction_tokens, d.rejected_prediction_tokens


@pytest.mark.parametrize("form", ["string", "parts"])
def test_a_prediction_speeds_the_answer_and_usage_counts_it(client, form):
    plain = edit(client)
    assert plain.usage.completion_tokens_details is None  # no prediction, no details
    content = FILE if form == "string" else [{"type": "text", "text": FILE[:20]}, {"type": "text", "text": FILE[20:]}]
    got = edit(client, content)
    assert got.choices[0].message.content == plain.choices[0].message.content == EDITED
    assert got.usage.completion_tokens == plain.usage.completion_tokens
    accepted, rejected = details(got.usage)
    ext = got.model_extra["localspec"]
    assert accepted > len(FILE) // 2 and rejected > 0  # the edit rejects a little; the rest is copied
    assert accepted + rejected <= ext["drafted"] and accepted <= ext["accepted"]


def test_the_final_stream_chunk_carries_the_prediction_counts(client):
    whole = edit(client, FILE)
    chunks = list(edit(client, FILE, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == EDITED
    assert chunks[-1].choices == [] and details(chunks[-1].usage) == details(whole.usage)
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_take_a_prediction_as_a_localspec_extension(client):
    kw = dict(model=MODEL, prompt=f"Add type hints to:\n{FILE}", max_tokens=200, temperature=0)
    plain = client.completions.create(**kw)
    got = client.completions.create(extra_body={"prediction": {"type": "content", "content": FILE}}, **kw)
    assert got.choices[0].text == plain.choices[0].text == EDITED
    assert details(got.usage)[0] > len(FILE) // 2
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True},
                                            extra_body={"prediction": {"type": "content", "content": FILE}}, **kw))
    assert details(chunks[-1].usage) == details(got.usage)


def test_logprobs_penalties_and_tools_work_with_a_prediction(client):
    tools = [{"type": "function", "function": {"name": "noop", "parameters": {"type": "object"}}}]
    for kw in (dict(logprobs=True, top_logprobs=2), dict(frequency_penalty=0.5, presence_penalty=0.3),
               dict(tools=tools, tool_choice="auto")):
        plain, got = edit(client, **kw), edit(client, FILE, **kw)
        assert got.choices[0].message.content == plain.choices[0].message.content, kw
        assert details(got.usage)[0] > 0, kw
        if "logprobs" in kw:
            lps = got.choices[0].logprobs.content
            assert len(lps) == got.usage.completion_tokens
            assert [t.token for t in lps] == [t.token for t in plain.choices[0].logprobs.content]


def test_an_explicit_off_does_not_draft_from_the_prediction(client):
    got = edit(client, FILE, extra_body={"localspec": {"mode": "off"}})
    assert got.choices[0].message.content == EDITED
    assert details(got.usage) == (0, 0) and got.model_extra["localspec"]["drafted"] == 0


@pytest.mark.parametrize("prediction,param,words", [
    ({"type": "text", "content": FILE}, "prediction.type", "content"),
    ({"type": "content", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, "prediction", "image_url"),
    ({"type": "content", "content": ""}, "prediction", "empty"),
    ({"type": "content", "content": [{"type": "text", "text": ""}]}, "prediction", "empty"),
    ({"type": "content", "content": 7}, "prediction.content", ""),
    ({"type": "content", "content": "x" * (N_CTX + 1)}, "prediction", f"context holds {N_CTX}"),
])
def test_bad_predictions_are_400s_in_openais_error_schema(srv, prediction, param, words):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say yes"}], "prediction": prediction}
    for path in ("/v1/chat/completions", "/v1/completions"):
        if path == "/v1/completions":
            body = {"model": MODEL, "prompt": "Say yes", "prediction": prediction}
        reply = request(srv.base_url, "POST", path, json_body=body)
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        # A union's alternatives name themselves ("prediction.content.str"), as everywhere in the API.
        assert error["type"] == "invalid_request_error" and error["param"].startswith(param), error
        assert words in error["message"], error


def test_n_above_one_stays_a_400_with_a_prediction(client):
    with pytest.raises(openai.BadRequestError, match="n=2"):
        edit(client, FILE, n=2)


def test_the_cache_key_ignores_the_prediction(module_home, tmp_path):
    cache = SemanticCache(tmp_path / "cache", embedder=ScriptedEmbedder())
    pipeline = scripted_pipeline(tiers=[scripted_tier(model_id=MODEL, script=SCRIPT, mode="lookup")], cache=cache,
                                 settings=PipelineSettings(cache_judge="rules"))
    with ServerThread(scripted_app(pipeline=pipeline, settings=ServerSettings(cache_judge=False))) as server:
        assert wait_until(lambda: request(server.base_url, "GET", "/health").status_code == 200, timeout=60)
        c = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
        first = edit(c, FILE)
        second = edit(c, "a different prediction altogether")
    assert first.model_extra["localspec"]["cache"]["status"] == "miss"
    assert second.model_extra["localspec"]["cache"]["status"] == "hit"
    assert second.choices[0].message.content == EDITED and details(second.usage) == (0, 0)


def test_a_remote_tier_receives_the_prediction_unchanged(monkeypatch):
    sent: dict = {}

    class Stream:
        def __iter__(self):
            return iter(())

        def close(self) -> None:
            pass

    def fake_open(self, **kwargs):
        sent.update(kwargs)
        return Stream()

    monkeypatch.setattr(RemoteTier, "_open", fake_open)
    remote = RemoteTier(TierSpec("remote", "remote", base_url="http://127.0.0.1:9/v1", model="m"))
    done: list[Done] = []
    finished = threading.Event()

    def sink(event) -> None:
        if isinstance(event, Done):
            done.append(event)
            finished.set()

    RemoteRunner(remote).start(GenerationRequest(prompt="edit this", prediction="the file\n"), sink=sink)
    assert finished.wait(30) and done[0].error is None
    assert sent["prediction"] == {"type": "content", "content": "the file\n"}


@pytest.mark.models
def test_the_real_model_gives_the_same_greedy_text_with_a_prediction(target_path, module_home):
    """The official client against the real target: prediction as a string and as parts, streamed
    and not; the greedy text equals the answer without a prediction, usage is consistent."""
    settings = ServerSettings(parallel=1, n_ctx=2048, n_threads=TEST_THREADS, mode="lookup", max_tokens_cap=256,
                              cache=False, router=False)
    code = "def greet(name):\n    print('Hello, ' + name)\n\n\ngreet('world')\n"
    with ServerThread(create_app(settings)) as server:
        assert wait_until(lambda: request(server.base_url, "GET", "/health").status_code == 200, timeout=300)
        c = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
        kw = dict(model=TARGET_ID, temperature=0, max_tokens=96, messages=[
            {"role": "user", "content": f"Rename the function greet to welcome. Reply with the code only.\n\n{code}"}])
        plain = c.chat.completions.create(**kw)
        for content in (code, [{"type": "text", "text": code[:10]}, {"type": "text", "text": code[10:]}]):
            prediction = {"type": "content", "content": content}
            got = c.chat.completions.create(prediction=prediction, **kw)
            assert got.choices[0].message.content == plain.choices[0].message.content
            assert got.usage.completion_tokens == plain.usage.completion_tokens
            accepted, rejected = details(got.usage)
            assert accepted > 0 and accepted + rejected <= got.model_extra["localspec"]["drafted"]
            chunks = list(c.chat.completions.create(prediction=prediction, stream=True,
                                                    stream_options={"include_usage": True}, **kw))
            assert "".join(x.choices[0].delta.content or "" for x in chunks if x.choices) == \
                plain.choices[0].message.content
            assert details(chunks[-1].usage) == (accepted, rejected)
