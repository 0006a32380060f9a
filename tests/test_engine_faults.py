"""An engine fault fails its own request once, frees the slot, and the engine serves on.

Control flow over the fake runtime (exact, batch-independent logits: the request that shares the
step with a faulty one must come out token for token as it does alone), then the real models:
a fault injected into a real engine step, through the worker and through the HTTP endpoint.
"""

from __future__ import annotations

import logging
import threading

import openai
import pytest

from tests.fake_runtime import FakeRuntime, logits_fn
from localspec.engine.config import EngineConfig, GenerationRequest
from localspec.engine.events import Done, Token
from localspec.engine.scheduler import Engine
from localspec.engine.worker import EngineWorker
from tests.common import TARGET_ID, TEST_THREADS
from tests.server_harness import ServerThread, request, wait_until

NV = 4
TARGET = logits_fn(NV, salts=(11,), scales=(1.2,), step_bonus=1.0)
DRAFT = logits_fn(NV, salts=(11, 12), scales=(1.2, 0.9), step_bonus=1.0)
BAD, GOOD = "0 1 2 3 0 1 2", "3 1 1 0 3 1 1"


class InjectedFault(RuntimeError):
    pass


def fake_engine(parallel: int = 2) -> Engine:
    return Engine(FakeRuntime(TARGET, NV, n_seq_max=parallel), FakeRuntime(DRAFT, NV, n_seq_max=parallel),
                  EngineConfig(parallel=parallel, draft_p_min=0.0))


def ask(prompt: str, mode: str = "lookup") -> GenerationRequest:
    return GenerationRequest(prompt=prompt, max_tokens=24, mode=mode, k=4)


def drain(handle) -> tuple[list[int], list[Done]]:
    ids, dones = [], []
    while not handle.events.empty():
        ev = handle.events.get_nowait()
        if isinstance(ev, Token):
            ids.extend(ev.ids)
        else:
            dones.append(ev)
    return ids, dones


def alone(prompt: str, mode: str) -> list[int]:
    eng = fake_engine()
    h = eng.submit(ask(prompt, mode))
    while not h.done.is_set():
        eng.step()
    return drain(h)[0]


def inject(monkeypatch, eng: Engine, where: str, is_bad, fired: list[int]) -> None:
    """Make one part of the step raise, every time, for the request `is_bad(active)` picks."""

    def fault():
        fired.append(eng.steps)
        raise InjectedFault(f"injected fault in {where}")

    if where in ("_accept", "_first_token", "_plan_draft", "_verify_rows", "_prefill_rows"):
        original = getattr(eng, where)

        def wrapped(slot, *args):
            if slot.active is not None and is_bad(slot.active):
                fault()
            return original(slot, *args)

        monkeypatch.setattr(eng, where, wrapped)
    elif where == "draft_model":
        original = eng.drafter.propose_many

        def propose_many(jobs):
            if any(is_bad(s.active) for s in eng.slots if s.active and s.seq in {j.seq for j in jobs}):
                fault()
            return original(jobs)

        monkeypatch.setattr(eng.drafter, "propose_many", propose_many)
    else:
        raise AssertionError(where)


@pytest.mark.parametrize("where", ["_accept", "_first_token", "_plan_draft", "_verify_rows", "_prefill_rows",
                                   "draft_model"])
def test_a_fault_fails_only_its_request_once_and_frees_its_slot(where, monkeypatch, caplog):
    bad_mode = "draft" if where == "draft_model" else "lookup"
    good_alone = alone(GOOD, "lookup")
    eng = fake_engine()
    fired: list[int] = []
    faulty: set[int] = set()
    inject(monkeypatch, eng, where, lambda a: a.handle.id in faulty, fired)
    caplog.set_level(logging.INFO, logger="localspec.engine")
    bad = eng.submit(ask(BAD, bad_mode))
    faulty.add(bad.id)
    good = eng.submit(ask(GOOD))
    while not bad.done.is_set():
        assert eng.step()
    # The step that hit the fault ended the request and freed its slot; it was not tried again.
    assert len(fired) == 1
    assert all(s.active is None or s.active.handle is good for s in eng.slots)
    while not good.done.is_set():
        eng.step()
    ids_bad, dones_bad = drain(bad)
    assert [d.finish_reason for d in dones_bad] == ["error"]
    assert dones_bad[0].error == f"InjectedFault: injected fault in {where}"
    ids_good, dones_good = drain(good)
    assert [d.finish_reason for d in dones_good] == ["length"] and ids_good == good_alone
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and f"request {bad.id} failed" in errors[0].getMessage()
    # The KV bookkeeping is intact: the next request in the freed slot answers as a fresh engine does.
    again = eng.submit(ask(BAD, "off"))
    while not again.done.is_set():
        eng.step()
    assert drain(again)[0] == alone(BAD, "off")


def test_a_failed_target_decode_fails_its_batch_once_and_the_engine_serves_on(monkeypatch, caplog):
    eng = fake_engine()
    original = eng.target.decode
    calls = {"n": 0}

    def decode(rows):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("llama_decode failed with code -1")
        return original(rows)

    monkeypatch.setattr(eng.target, "decode", decode)
    caplog.set_level(logging.INFO, logger="localspec.engine")
    handles = [eng.submit(ask(BAD)), eng.submit(ask(GOOD))]
    for _ in range(3):
        eng.step()
    assert [drain(h)[1][-1].finish_reason for h in handles] == ["error", "error"]
    assert all(s.active is None and s.kv == [] for s in eng.slots)
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1
    h = eng.submit(ask(GOOD))
    while not h.done.is_set():
        eng.step()
    assert drain(h)[0] == alone(GOOD, "lookup")


def test_a_fault_while_admitting_fails_that_request_only(monkeypatch):
    eng = fake_engine()
    original = eng._admit_into

    def admit(slot, handle, request, *rest):
        if request.prompt == BAD:
            raise InjectedFault("no KV for you")
        return original(slot, handle, request, *rest)

    monkeypatch.setattr(eng, "_admit_into", admit)
    bad, good = eng.submit(ask(BAD)), eng.submit(ask(GOOD))
    while not good.done.is_set():
        eng.step()
    assert bad.result.finish_reason == "error" and "no KV for you" in bad.result.error
    assert drain(good)[0] == alone(GOOD, "lookup")


def test_the_worker_fails_requests_once_when_the_step_itself_raises(monkeypatch, caplog):
    """A fault the step cannot place (here: step itself) ends every request once; it does not spin."""
    eng = fake_engine()
    caplog.set_level(logging.INFO, logger="localspec.engine")
    original = eng.step
    monkeypatch.setattr(eng, "step", lambda: (_ for _ in ()).throw(InjectedFault("step broke")))
    worker = EngineWorker(eng).start()
    try:
        handles = [worker.submit(ask(BAD)), worker.submit(ask(GOOD))]
        assert all(h.done.wait(60) for h in handles)
        assert [h.result.finish_reason for h in handles] == ["error", "error"]
        assert wait_until(lambda: not eng.busy, timeout=60)
        raised = [r for r in caplog.records if "engine step raised" in r.getMessage()]
        assert len(raised) == 1
        monkeypatch.setattr(eng, "step", original)
        h = worker.submit(ask(GOOD))
        assert h.done.wait(60) and h.result.finish_reason == "length"
    finally:
        worker.stop()


# ---------------------------------------------------------------- the real models


@pytest.fixture(scope="module")
def real_engine(target_path):
    eng = Engine.load(str(target_path), None, EngineConfig(n_ctx=1024, parallel=2, mode="lookup",
                                                            n_threads=TEST_THREADS))
    yield eng
    eng.close()


def chat(text: str) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": text}], max_tokens=24, mode="off")


@pytest.mark.models
def test_a_fault_in_a_real_engine_step_fails_one_request_through_the_worker(real_engine, monkeypatch, caplog):
    eng = real_engine
    fired: list[int] = []
    inject(monkeypatch, eng, "_accept", lambda a: a.request.messages[0].content.startswith("FAULT"), fired)
    caplog.set_level(logging.INFO, logger="localspec.engine")
    worker = EngineWorker(eng).start()
    try:
        bad = worker.submit(chat("FAULT: count from 1 to 30."))
        good = worker.submit(chat("Count from 1 to 10, separated by commas."))
        assert bad.done.wait(300) and good.done.wait(300)
        assert drain(bad)[1] == [bad.result] and bad.result.finish_reason == "error"
        assert "injected fault" in bad.result.error and len(fired) == 1
        assert good.result.finish_reason in ("stop", "length") and "1, 2, 3" in good.result.text
        assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1
        nxt = worker.submit(chat("Count from 1 to 10, separated by commas."))
        assert nxt.done.wait(300) and nxt.result.finish_reason in ("stop", "length")
        assert nxt.result.text == good.result.text  # greedy, and the slot KV was left clean
    finally:
        worker.stop()


@pytest.mark.models
def test_an_engine_fault_is_a_500_in_openai_schema_and_the_server_serves_on(target_path, draft_path, module_home):
    from localspec.server import Backend, ServerSettings, create_app

    settings = ServerSettings(api_key="k", parallel=2, n_ctx=1024, n_threads=TEST_THREADS, mode="off",
                              cache=False, router=False, embeddings=False)
    app = create_app(settings, load=Backend.load)
    with ServerThread(app) as srv:
        assert wait_until(lambda: request(srv.base_url, "GET", "/health", "k").status_code == 200, timeout=300)
        eng = app.state.loader.backend.engine
        fired: list[int] = []
        with pytest.MonkeyPatch.context() as mp:
            inject(mp, eng, "_accept", lambda a: "FAULT" in a.request.messages[-1].content, fired)
            client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="k", max_retries=0, timeout=300)
            results: dict[str, object] = {}

            def call(name: str, text: str) -> None:
                try:
                    results[name] = client.chat.completions.create(
                        model=TARGET_ID, messages=[{"role": "user", "content": text}], max_tokens=16)
                except openai.APIError as exc:
                    results[name] = exc

            threads = [threading.Thread(target=call, args=("bad", "FAULT: say hi")),
                       threading.Thread(target=call, args=("good", "Say hello in French."))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        bad = results["bad"]
        assert isinstance(bad, openai.InternalServerError) and bad.status_code == 500
        assert bad.body["code"] == "engine_error" and "injected fault" in bad.body["message"]
        assert len(fired) == 1
        assert results["good"].choices[0].finish_reason in ("stop", "length")
        after = client.chat.completions.create(model=TARGET_ID, messages=[{"role": "user", "content": "FAULT no more"}],
                                               max_tokens=4)
        assert after.choices[0].finish_reason in ("stop", "length")
        assert all(s.active is None for s in eng.slots)
