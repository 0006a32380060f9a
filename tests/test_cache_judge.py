"""The reuse judge: the yes/no margin, how the cache consults it, and the real 1.5B judging."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from localspec.cache import CacheScope, SemanticCache
from localspec.cache.judge import DEFAULT_JUDGE_THRESHOLD, EXAMPLES, judge_request, yes_no_margin
from localspec.cli import main
from localspec.engine.embedder import Embedder
from localspec.engine.events import TokenLogprob
from tests.common import plain_scope, TARGET_ID, TEST_THREADS

YES, NO, OTHER = 9454, 2753, 42
# A trap from the blind pairs whose facts agree, so the guard's rules (both sets) pass it, but whose
# answer differs; the 1.5B says No.
TRAP_PASSING_THE_GUARD = ("What are the symptoms of a vitamin D deficiency?",
                          "What are the symptoms of too much vitamin D?")
PARAPHRASE = ("How do I convert a string to an integer in Python?",
              "In Python, how can I turn a string into an integer?")


def test_margin_is_yes_minus_no_from_the_first_token():
    lp = TokenLogprob(YES, -0.1, ((YES, -0.1), (NO, -2.6), (OTHER, -5.0)))
    assert yes_no_margin(lp, {YES}, {NO}) == pytest.approx(2.5)
    # "No" below the listed alternatives: the least likely listed one bounds it, so the margin is
    # never larger than the true one.
    lp = TokenLogprob(YES, -0.1, ((YES, -0.1), (OTHER, -5.0)))
    assert yes_no_margin(lp, {YES}, {NO}) == pytest.approx(4.9)
    # "Yes" not listed at all: never serve.
    lp = TokenLogprob(NO, -0.05, ((NO, -0.05), (OTHER, -4.0)))
    assert yes_no_margin(lp, {YES}, {NO}) == -math.inf


def test_the_judge_asks_for_one_greedy_token_with_alternatives():
    req = judge_request("How do I reverse a list?", "Reverse a list how?")
    assert req.max_tokens == 1 and req.sampling.greedy and req.logprobs == 20
    user = req.messages[-1].content
    assert "Saved request: How do I reverse a list?" in user and "New request: Reverse a list how?" in user
    # The instructions and worked examples come first, the same in every judgement: the engine keeps
    # them pinned, so a judgement prefills only its pair.
    assert req.pin_prefix and len(req.messages) == 2 + 2 * len(EXAMPLES)
    assert judge_request("x", "y").messages[:-1] == req.messages[:-1]


class _AnsweredHandle:
    """An engine handle that already holds a one-token Yes/No answer with the given margin."""

    def __init__(self, margin: float) -> None:
        import queue

        from localspec.engine.events import Done, Stats, Token

        self.events = queue.SimpleQueue()
        lp = TokenLogprob(YES, -0.1, ((YES, -0.1), (NO, -0.1 - margin)))
        self.events.put(Token(text="Yes", ids=(YES,), origin="target", logprob=lp))
        self.events.put(Done(finish_reason="length", stats=Stats(mode="off"), text="Yes"))

    def cancel(self) -> None:
        pass


def test_the_judge_reads_the_pair_both_ways_and_keeps_the_smaller_margin():
    from localspec.cache.judge import ModelJudge

    margins = {("convert miles to km", "convert km to miles"): 2.0, ("convert km to miles", "convert miles to km"): -1.0}
    asked = []

    def submit(request):
        pair = request.messages[-1].content.removeprefix("Saved request: ").split("\nNew request: ")
        asked.append(tuple(pair))
        return _AnsweredHandle(margins[tuple(pair)])

    judge = ModelJudge(submit, lambda w: [YES] if w.strip().lower() == "yes" else [NO], threshold=0.25)
    a, b = "convert miles to km", "convert km to miles"
    assert judge.score(a, b) == pytest.approx(-1.0) and asked == [(a, b), (b, a)]
    asked.clear()
    assert judge.agrees(a, b) == (False, pytest.approx(-1.0)) and asked == [(a, b), (b, a)]
    asked.clear()
    assert judge.agrees(b, a) == (False, pytest.approx(-1.0)) and asked == [(b, a)]  # the first reading decides


class RecordingJudge:
    """Stands in for the model where the test is about the cache's use of a verdict."""

    def __init__(self, verdict: bool, score: float = 2.0) -> None:
        self.verdict, self.score, self.calls = verdict, score, []

    def agrees(self, saved: str, new: str) -> tuple[bool, float]:
        self.calls.append((saved, new))
        return self.verdict, self.score


def test_a_semantic_candidate_needs_the_judge(tmp_path: Path, embedder: Embedder):
    with SemanticCache(tmp_path / "c", embedder=embedder) as cache:
        cache.store(plain_scope(), "How do I reverse a list in Python?", "use reversed()", [])
        para = "What's the way to reverse a Python list?"
        no = RecordingJudge(False, 0.3)
        assert cache.lookup(plain_scope(), para, judge=no) is None
        assert no.calls == [("How do I reverse a list in Python?", para)]
        yes = RecordingJudge(True, 2.4)
        hit = cache.lookup(plain_scope(), para, judge=yes)
        assert hit is not None and hit.kind == "semantic" and hit.judge == 2.4
        stats = cache.stats()
        assert stats["judged"] == 2 and stats["judge_rejections"] == 1 and stats["semantic_hits"] == 1
        # An exact match is the same request: never judged.
        exact = RecordingJudge(False)
        assert cache.lookup(plain_scope(), "How do I reverse a list in Python?", judge=exact).kind == "exact"
        assert exact.calls == []
        # semantic=False (a caller with no judge to ask): exact matches only.
        assert cache.lookup(plain_scope(), para, semantic=False) is None


def test_a_judges_yes_is_remembered_for_that_prompt_until_its_entry_goes(tmp_path: Path, embedder: Embedder):
    saved, para = "How do I reverse a list in Python?", "What's the way to reverse a Python list?"
    with SemanticCache(tmp_path / "c", embedder=embedder) as cache:
        cache.store(plain_scope(), saved, "use reversed()", [])
        first = RecordingJudge(True, 2.4)
        assert cache.lookup(plain_scope(), para, judge=first).remembered is None and len(first.calls) == 1
        # The same prompt again, the same judge: served from the verdict, the judge not asked.
        again = RecordingJudge(False)
        hit = cache.lookup(plain_scope(), para, judge=again)
        assert hit is not None and hit.remembered and hit.judge == 2.4 and hit.matched_prompt == saved
        assert again.calls == [] and cache.stats()["remembered_verdicts"] == 1
        assert cache.stats()["entries"] == 1  # a verdict is not an entry
        # Another scope, or a judge with another threshold, does not inherit it.
        other_scope = CacheScope.from_request(model_hash="m", system_prompt="other", sampling={"temperature": 0.0})
        assert cache.lookup(other_scope, para, judge=RecordingJudge(True)) is None
        stricter = RecordingJudge(False)
        stricter.threshold = 3.0
        assert cache.lookup(plain_scope(), para, judge=stricter) is None and len(stricter.calls) == 1
        # The entry marked wrong: its verdicts go with it.
        assert cache.mark_wrong(hit.entry_id)
        assert cache.lookup(plain_scope(), para, judge=RecordingJudge(False)) is None
    with SemanticCache(tmp_path / "c", embedder=embedder) as cache:  # and they persist on disk
        cache.store(plain_scope(), saved, "use reversed()", [])
        cache.lookup(plain_scope(), para, judge=RecordingJudge(True, 1.5))
    with SemanticCache(tmp_path / "c", embedder=embedder) as cache:
        hit = cache.lookup(plain_scope(), para, judge=RecordingJudge(False))
        assert hit is not None and hit.remembered and hit.judge == 1.5
        # A verdict the guard refuses now (one an older, laxer guard let through) is dropped, not served.
        from localspec.cache.semantic import _judge_id, entry_id_for

        trap_saved, trap = "How do I convert a list to a string in Python?", "How do I convert a string to a list in Python?"
        cache.store(plain_scope(), trap_saved, "use join", [])
        entry = cache.lookup(plain_scope(), trap_saved)
        verdict = {"entry": entry.entry_id, "similarity": 0.97, "judge": 2.0,
                   "judge_id": _judge_id(RecordingJudge(True))}
        cache._store.put_verdict(entry_id_for(plain_scope(), trap), verdict, None)
        assert cache.lookup(plain_scope(), trap, judge=RecordingJudge(True)) is None
        assert cache._store.get_verdict(entry_id_for(plain_scope(), trap)) is None


class _SilentHandle:
    """An engine handle whose request never gets a slot: what a judge sees behind busy slots."""

    def __init__(self) -> None:
        import queue

        self.events = queue.SimpleQueue()
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def test_a_judge_that_gets_no_slot_times_out_and_the_lookup_misses(tmp_path: Path, embedder: Embedder):
    from localspec.cache.judge import JudgeTimeout, ModelJudge

    handles = []

    def submit(request):
        handles.append(_SilentHandle())
        return handles[-1]

    judge = ModelJudge(submit, lambda w: [YES] if w.strip().lower() == "yes" else [NO], timeout_s=0.2)
    with pytest.raises(JudgeTimeout, match="within 0.2 s"):
        judge.score("a", "b")
    assert handles[-1].cancelled  # the queued judgement does not run later for nothing
    with SemanticCache(tmp_path / "c", embedder=embedder) as cache:
        cache.store(plain_scope(), "How do I reverse a list in Python?", "use reversed()", [])
        assert cache.lookup(plain_scope(), "What's the way to reverse a Python list?", judge=judge) is None
        stats = cache.stats()
        assert stats["judge_errors"] == 1 and stats["semantic_hits"] == 0 and stats["errors"] == 0


@pytest.fixture(scope="module")
def model_judge(target_path: Path, module_home):
    from localspec.service import open_judge

    judge, close = open_judge(model=TARGET_ID, n_threads=TEST_THREADS)
    yield judge
    close()


def test_the_target_model_tells_a_paraphrase_from_a_trap_the_guard_passes(model_judge):
    from localspec.cache.guard import compare, conflict

    ok, score = model_judge.agrees(*PARAPHRASE)
    assert ok and score >= DEFAULT_JUDGE_THRESHOLD
    trap = TRAP_PASSING_THE_GUARD
    assert compare(*trap, similarity=0.88) is None and conflict(*trap) is None  # the rules alone would serve it
    ok, score = model_judge.agrees(*trap)
    assert not ok and score < DEFAULT_JUDGE_THRESHOLD


def test_cli_eval_with_the_judge_reports_its_curve(minilm_path: Path, target_path: Path, capsys):
    rc = main(["cache", "eval", "--split", "dev", "--limit", "12", "--embedding-model", str(minilm_path),
               "--latency-sample", "4", "--json"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert report["judge"]["model"].endswith(".gguf") and report["judge"]["judged_pairs"] > 0
    assert len(report["judge_curve"]) == 17 and "suggested_judge_threshold" in report
    assert report["latency_ms"]["timed_lookups"] == 4
    assert report["latency_ms"]["disagreements_with_probe"] == 0


@pytest.fixture(scope="module")
def judged_server(target_path, minilm_path, module_home):
    from localspec.server import ServerSettings, create_app
    from tests.server_harness import ServerThread, request, wait_until

    settings = ServerSettings(target=TARGET_ID, mode="off", parallel=1, n_ctx=1024, n_threads=TEST_THREADS,
                              max_tokens_cap=16, cache_semantic=True)  # the judge is on by default
    with ServerThread(create_app(settings)) as server:
        assert wait_until(lambda: request(server.base_url, "GET", "/health").status_code == 200, timeout=300)
        yield server


def test_the_endpoint_serves_a_judged_paraphrase_and_refuses_the_trap(judged_server):
    import openai

    client = openai.OpenAI(base_url=f"{judged_server.base_url}/v1", api_key="unused", max_retries=0, timeout=300)

    def ask(text: str):
        reply = client.chat.completions.create(model=TARGET_ID, messages=[{"role": "user", "content": text}],
                                               max_tokens=6, temperature=0)
        return reply.model_extra["localspec"]["cache"]

    assert ask(PARAPHRASE[0])["status"] == "miss"
    para = ask(PARAPHRASE[1])
    assert para["status"] == "hit" and para["kind"] == "semantic" and para["judge"] >= DEFAULT_JUDGE_THRESHOLD, para
    assert "remembered" not in para
    again = ask(PARAPHRASE[1])  # the judge's yes is remembered: no second judgement
    assert again["status"] == "hit" and again["remembered"] is True and again["judge"] == para["judge"], again
    assert ask(TRAP_PASSING_THE_GUARD[0])["status"] == "miss"
    assert ask(TRAP_PASSING_THE_GUARD[1])["status"] == "miss"  # the guard lets it through; the judge does not
    assert para["judged_by"] == TARGET_ID  # the answering tier's model id
    from tests.server_harness import request

    assert request(judged_server.base_url, "GET", "/v1/cache/stats").json()["judge"] == f"model:{TARGET_ID}"
