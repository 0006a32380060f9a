"""The request path from the endpoint to the engine: events are delivered, not polled, and a client
that goes away, queued or decoding, costs the engine nothing past the next step.

Engine-level rules run on the fake runtime (control flow); the endpoint's run on a real server on
loopback with the real target (one slot, so requests queue).
"""

from __future__ import annotations

import logging
import threading

import pytest

from fake_runtime import FakeRuntime, logits_fn
from localspec.engine.config import EngineConfig, GenerationRequest
from localspec.engine.events import Done, Event, Token
from localspec.engine.scheduler import Engine, Lane
from localspec.server import Backend, ServerSettings, create_app
from tests.conftest import TARGET_ID, TEST_THREADS
from tests.server_harness import OpenStream, ServerThread, request, wait_until

NV = 4
TARGET = logits_fn(NV, salts=(21,), scales=(1.2,), step_bonus=1.0)
KEY = "request-path-key"


def one_slot_engine() -> Engine:
    return Engine(FakeRuntime(TARGET, NV, n_seq_max=1), None, EngineConfig(parallel=1))


def ask(prompt: str = "0 1 2 3", max_tokens: int = 8) -> GenerationRequest:
    return GenerationRequest(prompt=prompt, max_tokens=max_tokens, mode="off")


# ---------------------------------------------------------------- the engine


def test_a_sink_receives_every_event_in_order_on_the_stepping_thread():
    eng = one_slot_engine()
    got: list[tuple[Event, str]] = []
    h = eng.submit(ask(), sink=lambda ev: got.append((ev, threading.current_thread().name)))
    while not h.done.is_set():
        eng.step()
    assert h.events.empty()  # the sink took them all
    assert isinstance(got[-1][0], Done) and all(isinstance(e, Token) for e, _ in got[:-1])
    assert sum(len(e.ids) for e, _ in got[:-1]) == got[-1][0].stats.completion_tokens == 8
    assert {name for _, name in got} == {threading.current_thread().name}


def test_a_faulty_sink_does_not_stop_the_engine():
    eng = one_slot_engine()

    def broken(ev: Event) -> None:
        raise ValueError("a face's bug")

    bad = eng.submit(ask(max_tokens=4), sink=broken)
    good = eng.submit(ask("3 2 1 0", max_tokens=4))
    while not (bad.done.is_set() and good.done.is_set()):
        eng.step()
    assert bad.result.finish_reason == "length" and good.result.finish_reason == "length"


def test_a_request_cancelled_while_queued_ends_at_the_next_step_without_a_slot():
    eng = one_slot_engine()
    running = eng.submit(ask(max_tokens=50))
    eng.step()  # admitted: the only slot is taken
    queued = eng.submit(ask("1 1 1 1"))
    eng.step()
    assert not queued.done.is_set()
    queued.cancel()
    eng.step()
    assert queued.done.is_set() and queued.result.finish_reason == "cancelled"
    assert not running.done.is_set()  # it did not wait for the slot, and took nothing from the running one


def test_the_judge_lane_is_admitted_before_queued_generations():
    eng = one_slot_engine()
    first = eng.submit(ask(max_tokens=3))
    eng.step()
    waiting = [eng.submit(ask(f"{i} 0 0 0", max_tokens=3)) for i in range(3)]
    judge = eng.submit(ask("2 2 2 2", max_tokens=1), lane=Lane.JUDGE)
    order: list[int] = []
    handles = [first, *waiting, judge]
    while not all(h.done.is_set() for h in handles):
        eng.step()
        for h in handles:
            if h.done.is_set() and h.id not in order:
                order.append(h.id)
    assert order[:2] == [first.id, judge.id]


def test_a_request_admitted_while_the_completion_thread_counts_is_not_lost():
    """The queue-depth gauge counts unfinished requests on the completion thread while the loop admits
    more. Before: the count stored a pruned copy of `jobs`, and a job the loop added between the copy and
    the store was lost: no longer counted against capacity (no 429), in /v1/ps, or cancelled at shutdown."""
    from localspec.server.errors import APIError
    from localspec.server.state import Admission

    class Unfinished:  # all Admission reads of a job
        def __init__(self) -> None:
            self.done = threading.Event()

    running, admitted = Unfinished(), Unfinished()

    class AdmittedAsTheCountEnds(set):
        """The loop's `add` lands just after the thread has read every job, before it stores anything."""

        def __iter__(self):
            yield from list(set.__iter__(self))
            set.add(self, admitted)

    admission = Admission(capacity=2, retry_after_s=1)
    admission.jobs = AdmittedAsTheCountEnds({running})
    admission.unfinished()  # on the completion thread
    assert admitted in admission.jobs
    with pytest.raises(APIError) as refused:  # both count against the capacity of 2
        admission.check()
    assert refused.value.status == 429


# ---------------------------------------------------------------- the endpoint


@pytest.fixture(scope="module")
def one_slot_server(target_path, module_home):
    settings = ServerSettings(api_key=KEY, parallel=1, max_queue=32, n_ctx=512, n_threads=TEST_THREADS, mode="off",
                              cache=False, router=False)
    app = create_app(settings, load=Backend.load)
    with ServerThread(app) as srv:
        assert wait_until(lambda: request(srv.base_url, "GET", "/health", KEY).status_code == 200, timeout=300)
        yield srv


def _engine(srv) -> Engine:
    return srv.app.state.loader.backend.engine


def _unfinished(srv) -> int:
    return srv.app.state.admission.unfinished()


def _stream(srv, i: int, max_tokens: int = 400) -> OpenStream:
    body = {"model": TARGET_ID, "messages": [{"role": "user", "content": f"Tell a long story about robot {i}."}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True}
    s = OpenStream(srv.base_url, "/v1/chat/completions", KEY, body)
    assert s.status_code == 200
    return s


def _idle(srv) -> bool:
    return _unfinished(srv) == 0 and all(s.active is None for s in _engine(srv).slots)


@pytest.mark.models
def test_waiting_requests_add_no_threads(one_slot_server):
    srv = one_slot_server
    assert wait_until(lambda: _idle(srv), timeout=120)
    streams = [_stream(srv, 0)]  # holds the only slot
    try:
        streams += [_stream(srv, i) for i in range(1, 9)]
        assert wait_until(lambda: _unfinished(srv) == 9, timeout=60)
        with_8 = threading.active_count()
        streams += [_stream(srv, i) for i in range(9, 25)]
        assert wait_until(lambda: _unfinished(srv) == 25, timeout=60)
        with_24 = threading.active_count()
        # 16 more waiting requests: no thread per request (a relay thread each would add 16).
        assert with_24 - with_8 <= 1, (with_8, with_24, sorted(t.name for t in threading.enumerate()))
    finally:
        for s in streams:
            s.close()
    assert wait_until(lambda: _idle(srv), timeout=120)


@pytest.mark.models
def test_a_client_gone_while_queued_ends_its_request_without_waiting_for_a_slot(one_slot_server):
    srv = one_slot_server
    assert wait_until(lambda: _idle(srv), timeout=120)
    running = _stream(srv, 100)
    try:
        queued = _stream(srv, 101)
        assert wait_until(lambda: _unfinished(srv) == 2, timeout=60)
        queued.close()
        # It ends while the first request still holds the slot: nobody waited for a slot to free.
        assert wait_until(lambda: _unfinished(srv) == 1, timeout=30)
        assert _engine(srv).slots[0].active is not None
        assert not _engine(srv)._pending
    finally:
        running.close()
    assert wait_until(lambda: _idle(srv), timeout=120)


@pytest.mark.models
def test_a_client_gone_while_decoding_frees_its_slot_within_a_step(one_slot_server):
    srv = one_slot_server
    assert wait_until(lambda: _idle(srv), timeout=120)
    stream = _stream(srv, 200)
    seen = 0
    for line in stream.lines():
        if line.startswith("data: ") and '"content"' in line:
            seen += 1
            if seen >= 3:
                break
    eng = _engine(srv)
    (job,) = list(srv.app.state.admission.jobs)
    stream.close()
    assert wait_until(lambda: job.cancelled, timeout=30, interval=0.001)
    steps_at_cancel = eng.steps
    assert wait_until(lambda: eng.slots[0].active is None, timeout=30, interval=0.001)
    # The step in flight when the cancel lands may finish; the next one ends the request before it decodes.
    # (Read with the test's own polling, so one step of slack.)
    assert eng.steps - steps_at_cancel <= 2, (steps_at_cancel, eng.steps)
    assert wait_until(job.done.is_set, timeout=30)  # the Done reaches the job from the completion thread
    assert job.result is not None and job.result.finish_reason == "cancelled"


# ---------------------------------------------------------------- an answer cancelled by the server

def _cancel_when_running(srv) -> threading.Thread:
    """Cancel the request in flight from the server's side, as a shutdown does, once it is decoding."""
    def cancel() -> None:
        def running() -> list:
            return [j for j in srv.app.state.admission.jobs if not j.done.is_set()]

        assert wait_until(lambda: len(running()) == 1, timeout=30, interval=0.005)
        running()[0].cancel()

    t = threading.Thread(target=cancel)
    t.start()
    return t


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_an_answer_cancelled_while_its_client_waits_is_a_503_naming_the_cancellation(path):
    """Before: the cancelled Done met the response schema's finish_reason and the client got a bare 500."""
    from tests.fake_tier import Reply, scripted, scripted_app, scripted_pipeline, scripted_tier

    slow = Reply("a long answer " * 20, pace_s=0.02)
    pipe = scripted_pipeline(tiers=[scripted_tier(script=scripted(default=slow))])
    app = scripted_app(pipeline=pipe, settings=ServerSettings(cache=False, router=False))
    with ServerThread(app) as srv:
        assert wait_until(lambda: request(srv.base_url, "GET", "/health").status_code == 200, timeout=60)
        body = {"model": "scripted-large", "max_tokens": 200, "temperature": 0}
        body |= {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"}
        canceller = _cancel_when_running(srv)
        reply = request(srv.base_url, "POST", path, json_body=body, timeout=60)
        canceller.join()
        assert reply.status_code == 503, reply.text
        error = reply.json()["error"]
        assert error["code"] == "cancelled" and "retry" in error["message"]

        canceller = _cancel_when_running(srv)
        stream = OpenStream(srv.base_url, path, "", body | {"stream": True}, timeout=60)
        lines = list(stream.lines())
        canceller.join()
        events = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
        assert '"code": "cancelled"' in events[-2] and events[-1] == "[DONE]", events[-3:]
        # The server goes on.
        assert request(srv.base_url, "POST", path, json_body=body | {"max_tokens": 3}).status_code == 200


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_shutdown_past_its_grace_ends_running_answers_with_the_cancelled_503():
    """SIGTERM / Ctrl+C while answers run: past the grace they are cancelled and still answered (the
    503 `cancelled`, a stream's error event and [DONE]). Before: uvicorn cancelled their tasks when the
    grace ran out, so a stream stopped mid-chunk without an end, a whole answer got a bare 500, and each
    left an "Exception in ASGI application" traceback in the log."""
    import openai

    from localspec.server import make_server
    from tests.fake_tier import Reply, scripted, scripted_app, scripted_pipeline, scripted_tier

    endless = Reply("and so on " * 2000, pace_s=0.02)  # far longer than the grace: it runs when the server stops
    pipe = scripted_pipeline(tiers=[scripted_tier(script=scripted(default=endless))])
    settings = ServerSettings(host="127.0.0.1", port=0, cache=False, router=False)
    app = scripted_app(pipeline=pipe, settings=settings)
    uvicorn_log = _Records()
    logging.getLogger("uvicorn.error").addHandler(uvicorn_log)
    outcomes: dict[str, object] = {}
    streaming = threading.Event()
    ask = {"model": "scripted-large", "messages": [{"role": "user", "content": "go on"}], "max_tokens": 4000,
           "temperature": 0}

    def stream(client: openai.OpenAI) -> None:
        try:
            for _ in client.chat.completions.create(stream=True, **ask):
                streaming.set()
            outcomes["stream"] = "ended without an error"
        except Exception as exc:
            outcomes["stream"] = exc

    def whole(client: openai.OpenAI) -> None:
        try:
            outcomes["whole"] = client.chat.completions.create(**ask)
        except Exception as exc:
            outcomes["whole"] = exc

    try:
        with ServerThread(app, server=make_server(settings, app, grace_s=0.2)) as srv:
            assert wait_until(lambda: request(srv.base_url, "GET", "/health").status_code == 200, timeout=60)
            client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
            clients = [threading.Thread(target=f, args=(client,)) for f in (stream, whole)]
            for t in clients:
                t.start()
            assert streaming.wait(60)
            assert wait_until(lambda: sum(not j.done.is_set() for j in app.state.admission.jobs) == 2, timeout=60)
        # Leaving the block stops the server as a signal does (should_exit), while both answers run.
        for t in clients:
            t.join(60)
    finally:
        logging.getLogger("uvicorn.error").removeHandler(uvicorn_log)
    got = outcomes["whole"]
    assert isinstance(got, openai.APIStatusError) and got.status_code == 503, got
    assert got.code == "cancelled" and "shutting down" in got.message
    got = outcomes["stream"]
    assert isinstance(got, openai.APIError) and not isinstance(got, openai.APIConnectionError), repr(got)
    assert "shutting down" in got.message
    assert not [r.getMessage() for r in uvicorn_log.records if r.levelno >= logging.ERROR]
