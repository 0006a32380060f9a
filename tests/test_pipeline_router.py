"""Routing through the shared pipeline with real tiers: the 0.5B (small) and the 1.5B (large).

Covers `route="auto"` and its record, an explicit tier bypassing the router, cascade escalation
on a forced low-confidence answer, the remote tier against a second localspec server on loopback
(success, then the server stopped: fallback, then the circuit opening), and `model: "auto"`
through the endpoint with the route in the response.
"""

from __future__ import annotations

import openai
import pytest

from localspec.engine.config import EngineConfig, GenerationRequest
from localspec.engine.scheduler import Engine
from localspec.pipeline import LocalTier, Pipeline, RemoteRunner
from localspec.router import CircuitBreaker, HeuristicPolicy, RemoteTier, RouteInput, Router, TierSpec
from localspec.server import Backend, ServerSettings, create_app
from tests.conftest import DRAFT_ID, TARGET_ID, TEST_THREADS
from tests.server_harness import ServerThread, request, wait_until

pytestmark = pytest.mark.models
EASY = "Say hi."
HARD = ("A shop sells 3 pens for 4 dollars and 5 notebooks for 12 dollars. First work out the price of one pen, "
        "then the price of one notebook, then how much 7 pens and 9 notebooks cost together, and finally the change "
        "from 50 dollars. Explain each step, and check the result twice before answering.")
SPECS = [TierSpec("small", "local", target=DRAFT_ID), TierSpec("large", "local", target=TARGET_ID)]


def _engine(path) -> Engine:
    return Engine.load(str(path), None, EngineConfig(n_ctx=1024, n_threads=TEST_THREADS, mode="off", parallel=2))


@pytest.fixture(scope="module")
def engines(target_path, draft_path):
    small, large = _engine(draft_path), _engine(target_path)
    yield small, large
    small.close()
    large.close()


def _pipeline(engines, router: Router | None = None, extra: dict | None = None) -> Pipeline:
    small, large = engines
    tiers = {
        "small": LocalTier("small", small, DRAFT_ID, None, DRAFT_ID, owns_engine=False),
        "large": LocalTier("large", large, TARGET_ID, None, TARGET_ID, owns_engine=False),
        **(extra or {}),
    }
    return Pipeline(tiers, "large", router=router or Router(SPECS, HeuristicPolicy()))


def _ask(text: str, max_tokens: int = 12) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": text}], max_tokens=max_tokens)


def _answer(job) -> str:
    assert job.done.wait(300), "the job did not finish"
    assert job.result.finish_reason in ("stop", "length"), job.result
    return job.result.text


def test_auto_routes_by_the_policy_and_records_why(engines):
    pipe = _pipeline(engines)
    try:
        for text, want in ((EASY, "small"), (HARD, "large")):
            decision = pipe.router.decide(RouteInput.from_request(_ask(text)))
            assert decision.tier == want, decision
            job = pipe.submit(_ask(text), route="auto")
            routed = _answer(job)
            assert job.tier == want and job.route["tier"] == want and job.route["policy"] == "heuristic"
            assert job.route["reason"] and 0.0 <= job.route["score"] <= 1.0 and job.route["features"]
            assert routed == _answer(pipe.submit(_ask(text), route=want))  # greedy: the tier's own answer
    finally:
        pipe.close()


def test_an_explicit_tier_bypasses_the_router(engines):
    pipe = _pipeline(engines)
    try:
        job = pipe.submit(_ask(HARD), route="small")  # the router would pick large
        _answer(job)
        assert job.tier == "small" and job.route["policy"] == "explicit"
    finally:
        pipe.close()


def test_cascade_escalates_on_a_forced_low_confidence_answer(engines):
    unsure = Router(SPECS, HeuristicPolicy(), cascade=True, min_mean_logprob=0.0)  # every answer is "unsure"
    pipe = _pipeline(engines, unsure)
    try:
        job = pipe.submit(_ask(EASY), route="auto")
        text = _answer(job)
        assert job.route["cascade"] and job.route["escalated"] is True and "low confidence" in job.route["escalation_reason"]
        assert job.tier == "large" and job.route["tier"] == "large"
        assert text == _answer(pipe.submit(_ask(EASY), route="large"))  # the user sees only the large answer
    finally:
        pipe.close()
    sure = Router(SPECS, HeuristicPolicy(), cascade=True, min_mean_logprob=-1e9)
    pipe = _pipeline(engines, sure)
    try:
        job = pipe.submit(_ask(EASY), route="auto")
        text = _answer(job)
        assert job.route["escalated"] is False and job.tier == "small"
        assert text == _answer(pipe.submit(_ask(EASY), route="small"))
    finally:
        pipe.close()


def test_remote_tier_then_fallback_then_the_circuit_opens(engines, draft_path):
    """A second localspec server plays the remote engine (vLLM, TGI, llama-server speak the same protocol)."""
    remote_settings = ServerSettings(target=DRAFT_ID, mode="off", parallel=1, n_ctx=1024, n_threads=TEST_THREADS,
                                     cache=False)
    breaker = CircuitBreaker(failure_threshold=2, cooldown_s=3600)
    with ServerThread(create_app(remote_settings)) as srv:
        assert wait_until(lambda: request(srv.base_url, "GET", "/health").status_code == 200, timeout=300)
        spec = TierSpec("remote", "remote", base_url=f"{srv.base_url}/v1", model=DRAFT_ID, timeout_s=30)
        runner = RemoteRunner(RemoteTier(spec, breaker=breaker, attempts=1))
        router = Router([*SPECS, spec], HeuristicPolicy())
        pipe = _pipeline(engines, router, {"remote": runner})
        job = pipe.submit(_ask(EASY), route="remote")
        assert _answer(job) and job.tier == "remote" and "fallback" not in job.route
    # The remote server is gone.
    try:
        reasons = []
        for _ in range(3):
            job = pipe.submit(_ask(EASY), route="remote")
            assert _answer(job), "the fallback answers"
            assert job.tier == "large" and job.route["tier"] == "large"
            reasons.append(job.route["fallback"])
        assert all("remote unavailable" in r for r in reasons), reasons
        assert "connection failed" in reasons[0] and "circuit open" in reasons[-1], reasons
        assert breaker.state == "open"
    finally:
        pipe.close()


def test_model_auto_through_the_endpoint_shows_the_route(engines):
    def load(_settings):
        pipe = _pipeline(engines)
        routes = {"auto": "auto", DRAFT_ID: "small", TARGET_ID: "large"}
        return Backend(pipeline=pipe, target_id=TARGET_ID, target_names=set(routes), draft_id=None,
                       profile="default", routes=routes)

    with ServerThread(create_app(ServerSettings(n_threads=TEST_THREADS, cache=False), load=load)) as srv:
        assert wait_until(lambda: request(srv.base_url, "GET", "/health").status_code == 200, timeout=120)
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
        for text, want in ((EASY, "small"), (HARD, "large")):
            r = client.chat.completions.create(model="auto", messages=[{"role": "user", "content": text}],
                                               max_tokens=8, temperature=0)
            route = r.model_extra["localspec"]["route"]
            assert route["tier"] == want and route["reason"], route
        explicit = client.chat.completions.create(model=DRAFT_ID, messages=[{"role": "user", "content": HARD}],
                                                  max_tokens=4, temperature=0)
        assert explicit.model_extra["localspec"]["route"]["policy"] == "explicit"
        chunks = list(client.chat.completions.create(model="auto", messages=[{"role": "user", "content": EASY}],
                                                     max_tokens=8, temperature=0, stream=True))
        final = [c for c in chunks if c.choices and c.choices[0].finish_reason]
        assert final[0].model_extra["localspec"]["route"]["tier"] == "small"
        cards = {m.id: m.model_extra["localspec"] for m in client.models.list().data}
        assert cards["auto"]["model"] == "router" and cards[DRAFT_ID]["route"] == "small"


@pytest.mark.anyio
async def test_the_chat_app_routes_auto_and_shows_the_route(engines, tmp_path):
    from localspec.tui import ChatApp, ChatParams, ChatStore, LocalBackend
    from tests.tui_support import wait_for
    from localspec.tui.widgets import MessageView

    pipe = _pipeline(engines)
    small, large = engines
    app = ChatApp(lambda _p, **_: LocalBackend(large, profile="default", target=TARGET_ID, owns_engine=False, pipeline=pipe),
                  store=ChatStore(tmp_path / "chats.sqlite"),
                  new_chat_params=ChatParams(temperature=0.0, max_tokens=8, route="auto"))
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: app.backend is not None, 60, "the backend")
        await pilot.click("#prompt")
        await pilot.press(*EASY)
        await pilot.press("enter")
        await wait_for(pilot, lambda: any(m.role == "assistant" and m.meta.get("finish_reason")
                                          for m in app.store.messages(app.chat_id)), 240, "the reply")
        stored = app.store.messages(app.chat_id)[-1]
        assert stored.meta["route"].startswith("small (heuristic score"), stored.meta
        view = [v for v in app.query(MessageView) if v.role == "assistant"][-1]
        assert "route small" in str(view.query_one(".route").render())


@pytest.fixture
def anyio_backend():
    return "asyncio"


def test_the_default_profile_serves_auto_with_a_lazily_loaded_small_tier(target_path, draft_path, module_home):
    """The real start-up path (`localspec serve`): Backend.load opens the pipeline with the profile's router."""
    settings = ServerSettings(n_ctx=1024, n_threads=TEST_THREADS, parallel=1, mode="off")
    app = create_app(settings)
    with ServerThread(app) as srv:
        assert wait_until(lambda: request(srv.base_url, "GET", "/health").status_code == 200, timeout=300), (
            request(srv.base_url, "GET", "/health").text
        )
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
        cards = {m.id: m.model_extra["localspec"] for m in client.models.list().data}
        assert cards["auto"]["route"] == "auto" and cards[DRAFT_ID]["route"] == "small"
        assert cards[TARGET_ID]["route"] == "large"
        r = client.chat.completions.create(model="auto", messages=[{"role": "user", "content": EASY}],
                                           max_tokens=6, temperature=0)
        assert r.model_extra["localspec"]["route"]["tier"] == "small" and r.choices[0].message.content
        assert "small" in app.state.loader.backend.pipeline.tiers  # loaded on that first routed request
        again = client.chat.completions.create(model="auto", messages=[{"role": "user", "content": EASY}],
                                               max_tokens=6, temperature=0)
        assert again.model_extra["localspec"]["cache"]["status"] == "hit"  # exact matches are cached by default
        assert again.choices[0].message.content == r.choices[0].message.content
