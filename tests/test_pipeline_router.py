"""Routing through the shared pipeline: the real Pipeline, LocalTier, EngineWorker and Engine over
scripted models (tests/fake_tier.py), so what is tested is the control flow, in seconds.

Covers `route="auto"` and its record, an explicit tier bypassing the router, cascade escalation
(the small tier unsure, sure, or escalation impossible), an engine failure, the remote tier
against a second server on loopback (success, then the server stopped: fallback, then the circuit
opening), and `model: "auto"` through the endpoint and the chat app with the route shown. The
last test starts the real default profile (`localspec serve`'s path) and runs with the models.
"""

from __future__ import annotations

import openai
import pytest

from localspec.engine.config import GenerationRequest
from localspec.pipeline import RemoteRunner
from localspec.router import CircuitBreaker, HeuristicPolicy, RemoteTier, RouteInput, Router, TierSpec
from localspec.server import ServerSettings, create_app
from tests.common import DRAFT_ID, TARGET_ID, TEST_THREADS
from tests.fake_tier import Reply, scripted, scripted_app, scripted_backend, scripted_pipeline, scripted_tier
from tests.server_harness import ServerThread, request, wait_until

EASY = "Say hi."
HARD = ("A shop sells 3 pens for 4 dollars and 5 notebooks for 12 dollars. First work out the price of one pen, "
        "then the price of one notebook, then how much 7 pens and 9 notebooks cost together, and finally the change "
        "from 50 dollars. Explain each step, and check the result twice before answering.")
SMALL_ID, LARGE_ID = "scripted-small", "scripted-large"
SPECS = [TierSpec("small", "local", target=SMALL_ID), TierSpec("large", "local", target=LARGE_ID)]
SMALL_SAYS, LARGE_SAYS = "Hi from the small tier.", "Hi from the large tier."


def _pipeline(router: Router | None = None, extra: dict | None = None, small: Reply | str = SMALL_SAYS,
              large_ctx: int = 1024):
    tiers = [scripted_tier(name="small", model_id=SMALL_ID, script=scripted(default=small)),
             scripted_tier(name="large", model_id=LARGE_ID, script=scripted(default=LARGE_SAYS), n_ctx=large_ctx),
             *(extra or {}).values()]
    return scripted_pipeline(tiers=tiers, default_tier="large", router=router or Router(SPECS, HeuristicPolicy()))


def _ask(text: str, max_tokens: int = 32) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": text}], max_tokens=max_tokens)


def _answer(job) -> str:
    assert job.done.wait(60), "the job did not finish"
    assert job.result.finish_reason in ("stop", "length"), job.result
    return job.result.text


def test_auto_routes_by_the_policy_and_records_why():
    pipe = _pipeline()
    try:
        for text, want in ((EASY, "small"), (HARD, "large")):
            decision = pipe.router.decide(RouteInput.from_request(_ask(text)))
            assert decision.tier == want, decision
            job = pipe.submit(_ask(text), route="auto")
            routed = _answer(job)
            assert job.tier == want and job.route.tier == want and job.route.policy == "heuristic"
            assert job.route.reason and 0.0 <= job.route.decision.score <= 1.0 and job.route.decision.features
            assert routed == (SMALL_SAYS if want == "small" else LARGE_SAYS)
            assert routed == _answer(pipe.submit(_ask(text), route=want))  # the tier's own answer
    finally:
        pipe.close()


def test_an_explicit_tier_bypasses_the_router():
    pipe = _pipeline()
    try:
        job = pipe.submit(_ask(HARD), route="small")  # the router would pick large
        assert _answer(job) == SMALL_SAYS
        assert job.tier == "small" and job.route.policy == "explicit"
    finally:
        pipe.close()


def test_cascade_escalates_on_a_forced_low_confidence_answer():
    unsure = Router(SPECS, HeuristicPolicy(), cascade=True, min_mean_logprob=0.0)  # every answer is "unsure"
    pipe = _pipeline(unsure)
    try:
        job = pipe.submit(_ask(EASY), route="auto")
        text = _answer(job)
        assert job.route.decision.cascade and job.route.escalated is True and "low confidence" in job.route.escalation_reason
        assert job.tier == "large" and job.route.tier == "large"
        assert text == LARGE_SAYS == _answer(pipe.submit(_ask(EASY), route="large"))  # the user sees only the large answer
    finally:
        pipe.close()
    sure = Router(SPECS, HeuristicPolicy(), cascade=True, min_mean_logprob=-1e9)
    pipe = _pipeline(sure)
    try:
        job = pipe.submit(_ask(EASY), route="auto")
        text = _answer(job)
        assert job.route.escalated is False and job.tier == "small"
        assert text == SMALL_SAYS == _answer(pipe.submit(_ask(EASY), route="small"))
    finally:
        pipe.close()


@pytest.mark.parametrize("confident", [True, False])
def test_cascade_keeps_a_sure_small_answer_and_escalates_an_unsure_one(confident):
    """The default rule on the small tier's own logprobs: sure (each token ~0) keeps, unsure escalates."""
    small = Reply(SMALL_SAYS, confidence=30.0 if confident else 1.0)
    pipe = _pipeline(Router(SPECS, HeuristicPolicy(), cascade=True), small=small)
    try:
        job = pipe.submit(_ask(EASY), route="auto")
        text = _answer(job)
        assert job.route.escalated is (not confident), job.route
        assert (job.route.mean_logprob < -0.5) is (not confident)
        assert text == (SMALL_SAYS if confident else LARGE_SAYS) and job.tier == ("small" if confident else "large")
    finally:
        pipe.close()


def test_an_escalation_the_large_tier_cannot_take_keeps_the_small_answer():
    """The large tier's context is too small for the request: the small answer stands, and the route says why."""
    long_question = "hi " * 30  # simple (routed small), and longer than the large tier's 64-token context
    pipe = _pipeline(Router(SPECS, HeuristicPolicy(), cascade=True, min_mean_logprob=0.0), large_ctx=64)
    try:
        job = pipe.submit(_ask(long_question), route="auto")
        assert _answer(job) == SMALL_SAYS and job.tier == "large"
        assert "escalation failed" in job.route.escalation_reason and "kept the small answer" in job.route.escalation_reason
    finally:
        pipe.close()


def test_an_engine_failure_ends_the_job_with_an_error_and_is_not_cached():
    from localspec.cache import SemanticCache

    pipe = scripted_pipeline(tiers=[scripted_tier(script=scripted({"boom": Reply("", fail="scripted fault")}))],
                             cache=SemanticCache(embedder=None))
    try:
        for _ in range(2):
            job = pipe.submit(_ask("boom"))
            assert job.done.wait(60) and job.result.finish_reason == "error" and "scripted fault" in job.result.error
            assert job.cache.status == "miss"  # the failed answer was not stored
        assert _answer(pipe.submit(_ask("fine"))) == "OK."  # the engine serves the next request
    finally:
        pipe.close()


def test_remote_tier_then_fallback_then_the_circuit_opens():
    """A second server plays the remote engine (vLLM, TGI, llama-server speak the same protocol)."""
    remote_says = "Hi from the remote tier."
    remote_pipe = scripted_pipeline(tiers=[scripted_tier(model_id="scripted-remote", script=scripted(default=remote_says))])
    breaker = CircuitBreaker(failure_threshold=2, cooldown_s=3600)
    with ServerThread(scripted_app(pipeline=remote_pipe, settings=ServerSettings(cache=False))) as srv:
        assert wait_until(lambda: request(srv.base_url, "GET", "/health").status_code == 200, timeout=60)
        spec = TierSpec("remote", "remote", base_url=f"{srv.base_url}/v1", model="scripted-remote", timeout_s=30)
        runner = RemoteRunner(RemoteTier(spec, breaker=breaker, attempts=1))
        router = Router([*SPECS, spec], HeuristicPolicy())
        pipe = _pipeline(router, {"remote": runner})
        job = pipe.submit(_ask(EASY), route="remote")
        assert _answer(job) == remote_says and job.tier == "remote" and job.route.fallback is None
    # The remote server is gone.
    try:
        reasons = []
        for _ in range(3):
            job = pipe.submit(_ask(EASY), route="remote")
            assert _answer(job) == LARGE_SAYS, "the best local tier answers"
            assert job.tier == "large" and job.route.tier == "large"
            reasons.append(job.route.fallback)
        assert all("remote unavailable" in r for r in reasons), reasons
        assert "connection failed" in reasons[0] and "circuit open" in reasons[-1], reasons
        assert breaker.state == "open"
    finally:
        pipe.close()


def test_model_auto_through_the_endpoint_shows_the_route():
    routes = {"auto": "auto", SMALL_ID: "small", LARGE_ID: "large"}
    backend = scripted_backend(pipeline=_pipeline(), routes=routes)
    with ServerThread(scripted_app(backend=backend, settings=ServerSettings(cache=False))) as srv:
        assert wait_until(lambda: request(srv.base_url, "GET", "/health").status_code == 200, timeout=60)
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
        for text, want in ((EASY, "small"), (HARD, "large")):
            r = client.chat.completions.create(model="auto", messages=[{"role": "user", "content": text}],
                                               max_tokens=8, temperature=0)
            route = r.model_extra["localspec"]["route"]
            assert route["tier"] == want and route["reason"], route
        explicit = client.chat.completions.create(model=SMALL_ID, messages=[{"role": "user", "content": HARD}],
                                                  max_tokens=4, temperature=0)
        assert explicit.model_extra["localspec"]["route"]["policy"] == "explicit"
        chunks = list(client.chat.completions.create(model="auto", messages=[{"role": "user", "content": EASY}],
                                                     max_tokens=8, temperature=0, stream=True))
        final = [c for c in chunks if c.choices and c.choices[0].finish_reason]
        assert final[0].model_extra["localspec"]["route"]["tier"] == "small"
        cards = {m.id: m.model_extra["localspec"] for m in client.models.list().data}
        assert cards["auto"]["model"] == "router" and cards[SMALL_ID]["route"] == "small"


@pytest.mark.anyio
async def test_the_chat_app_routes_auto_and_shows_the_route(tmp_path):
    from localspec.tui import ChatApp, ChatParams, ChatStore, LocalBackend
    from tests.tui_support import wait_for
    from localspec.tui.widgets import MessageView

    pipe = _pipeline()
    large = pipe.tiers["large"].engine
    app = ChatApp(lambda _p, **_: LocalBackend(large, profile="default", target=LARGE_ID, owns_engine=False, pipeline=pipe),
                  store=ChatStore(tmp_path / "chats.sqlite"),
                  new_chat_params=ChatParams(temperature=0.0, max_tokens=8, route="auto"))
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: app.backend is not None, 60, "the backend")
        await pilot.click("#prompt")
        await pilot.press(*EASY)
        await pilot.press("enter")
        await wait_for(pilot, lambda: any(m.role == "assistant" and m.meta.get("finish_reason")
                                          for m in app.store.messages(app.chat_id)), 60, "the reply")
        stored = app.store.messages(app.chat_id)[-1]
        assert stored.meta["route"].startswith("small (heuristic score"), stored.meta
        assert stored.content == SMALL_SAYS[:8]  # max_tokens=8 bytes of the small tier's answer
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
