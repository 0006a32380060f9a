"""Router evaluation: the task set, the checker, and the APGR / CPT arithmetic."""

from __future__ import annotations

import json

import numpy as np
import pytest

from localspec.router.checker import check
from localspec.router.curve import evaluate_router, routing_curve
from localspec.router.evaluation import label_of, read_labels, train_from_labels, write_labels
from localspec.router.tasks import Task, kfold, load_tasks, split

# ---------------------------------------------------------------- the task set


def test_shipped_task_set_and_split():
    tasks = load_tasks()
    assert len(tasks) >= 120
    kinds = {t.kind for t in tasks}
    assert kinds == {"code", "math"}
    assert all(t.tests for t in tasks if t.kind == "code") and all(t.answer is not None for t in tasks if t.kind == "math")
    train, held = split(tasks)
    assert split(tasks) == (train, held)  # deterministic
    assert not {t.id for t in train} & {t.id for t in held}
    assert len(train) + len(held) == len(tasks) and abs(len(train) - len(held)) <= 2
    for kind in kinds:
        assert abs(sum(t.kind == kind for t in train) - sum(t.kind == kind for t in held)) <= 1


def test_kfold_holds_out_every_task_once_with_the_same_mix():
    tasks = load_tasks()
    folds = kfold(tasks, 5)
    assert kfold(tasks, 5) == folds  # deterministic
    held_ids = [t.id for _, held in folds for t in held]
    assert sorted(held_ids) == sorted(t.id for t in tasks)  # each task held out exactly once
    for train, held in folds:
        assert not {t.id for t in train} & {t.id for t in held}
        assert len(train) + len(held) == len(tasks)
        for kind in ("code", "math"):
            n_kind = sum(t.kind == kind for t in tasks)
            assert abs(sum(t.kind == kind for t in held) - n_kind / 5) < 1  # stratified by kind
    # The file's order does not decide the folds: a reversed file gives the same held-out sets.
    again = kfold(list(reversed(tasks)), 5)
    assert [{t.id for t in h} for _, h in again] == [{t.id for t in h} for _, h in folds]
    with pytest.raises(ValueError):
        kfold(tasks, 1)


@pytest.mark.parametrize("argv", [["router", "eval", "--from-outcomes"], ["cache", "eval", "--split", "test"]])
def test_eval_data_outside_a_checkout_is_one_line_saying_where(argv, tmp_path, monkeypatch, capsys):
    """From a wheel the evaluation data is not installed: LOCALSPEC_EVALS_DIR finds a copy, and
    without one the command stops with one line naming the variable, having downloaded nothing."""
    from localspec.cli import main
    from localspec.evals import EVALS_ENV, evals_dir

    monkeypatch.setenv(EVALS_ENV, str(tmp_path))  # a folder without the data
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert [ln for ln in err.splitlines() if ln.startswith("error:")] == [err.splitlines()[0]], err
    assert "Traceback" not in err and EVALS_ENV in err and "evals/" in err, err
    monkeypatch.setenv(EVALS_ENV, str(tmp_path / "nowhere"))
    assert main(argv) == 1 and "not a folder" in capsys.readouterr().err
    monkeypatch.delenv(EVALS_ENV)
    assert (evals_dir() / "router" / "tasks.jsonl").is_file()  # the checkout's copy


def test_malformed_task_file_is_a_config_error(tmp_path):
    from localspec.errors import ConfigError

    path = tmp_path / "t.jsonl"
    path.write_text('{"id": "a", "kind": "code", "prompt": "p", "tests": []}\n')
    with pytest.raises(ConfigError, match="needs tests"):
        load_tasks(path)
    path.write_text('{"id": "a", "kind": "math", "prompt": "p", "answer": 1}\n' * 2)
    with pytest.raises(ConfigError, match="appears twice"):
        load_tasks(path)


# ---------------------------------------------------------------- the checker

CODE = Task("c", "code", "Write `second_largest(nums)`...", tests=(
    "assert second_largest([4,4,3,1]) == 3",
    "assert second_largest([5,5,5]) is None",
))
MATH = Task("m", "math", "...", answer=48.3)


def test_code_checker_runs_the_tests():
    good = "Here you go:\n```python\ndef second_largest(nums):\n    s = sorted(set(nums))\n    return s[-2] if len(s) > 1 else None\n```"
    bad = "```python\ndef second_largest(nums):\n    return sorted(nums)[-2]\n```"
    assert check(CODE, good).passed
    r = check(CODE, bad)
    assert not r.passed and "AssertionError" in r.detail
    assert not check(CODE, "```python\ndef second_largest(nums:\n```").passed  # syntax error
    assert not check(CODE, "I cannot do that.").passed


def test_code_checker_times_out_and_is_isolated(monkeypatch):
    from localspec.router import checker

    monkeypatch.setattr(checker, "TIMEOUT_S", 2.0)  # the rule, not its length: a 10 s wait proves nothing more
    loop = "```python\ndef second_largest(nums):\n    while True:\n        pass\n```"
    r = check(CODE, loop)
    assert not r.passed and ("timed out" in r.detail or "exit status" in r.detail)
    sneaky = "```python\nimport os\nassert os.environ.get('LOCALSPEC_HOME') is None\ndef second_largest(n):\n    s=sorted(set(n))\n    return s[-2] if len(s)>1 else None\n```"
    assert check(CODE, sneaky).passed  # an empty environment: none of ours leaks in


@pytest.mark.parametrize(("text", "ok"), [
    ("Each pays 144.90 / 3 = 48.30.\nAnswer: 48.30", True),
    (r"The total per friend is \(\boxed{48.3}\) dollars, after 3 friends.", True),
    ("Answer: $48.3", True),
    ("Each pays 42 dollars.\nAnswer: 42", False),
    ("I am not sure.", False),
    (r"\boxed{48} dollars", False),
])
def test_math_checker(text, ok):
    assert check(MATH, text).passed is ok


@pytest.mark.parametrize(("answer", "text", "ok"), [
    (8160, "Answer: 8160", True),
    (8160, "Answer: 8,161", False),  # off by one, however large the key
    (14450, "Answer: 14449", False),
    (55.555556, "Answer: 55.56", True),  # the key to cents
    (55.555556, "Answer: 55.6", False),
    (0.375, "Answer: 0.38", True),
    (48.3, "Answer: 48.31", False),  # a cent off is a wrong amount
])
def test_math_checker_accepts_the_key_to_cents_and_nothing_further(answer, text, ok):
    assert check(Task("m", "math", "", answer=answer), text).passed is ok


def test_math_checker_reads_fractions_and_thousands():
    assert check(Task("f", "math", "", answer=0.375), r"\boxed{\frac{3}{8}}").passed
    assert check(Task("t", "math", "", answer=1015), "Answer: 1,015").passed


# ---------------------------------------------------------------- metrics


def _outcomes(n=200, gain_share=0.1, seed=0):
    """Small passes 50%; the large tier additionally passes `gain_share` of the tasks."""
    rng = np.random.default_rng(seed)
    small = (rng.random(n) < 0.5).astype(float)
    gain = np.zeros(n)
    candidates = np.nonzero(small == 0)[0]
    gain[rng.choice(candidates, int(gain_share * n), replace=False)] = 1
    return small, small + gain, gain, rng


def test_perfect_router_recovers_the_gap_at_once():
    small, large, gain, rng = _outcomes()
    c = routing_curve(gain + 0.001 * rng.random(len(gain)), small, large)
    assert c.quality[0] == pytest.approx(small.mean()) and c.quality[-1] == pytest.approx(large.mean())
    assert c.pgr[0] == 0 and c.pgr[-1] == pytest.approx(1.0)
    assert c.apgr > 0.94  # 1 - (10% of the tasks carry the gain) / 2
    assert c.cpt(0.5) == pytest.approx(0.05)


def test_random_router_scores_about_half_and_inverse_below():
    small, large, gain, rng = _outcomes()
    random_apgrs = [routing_curve(rng.random(len(gain)), small, large).apgr for _ in range(200)]
    assert np.mean(random_apgrs) == pytest.approx(0.5, abs=0.03)
    inverse = routing_curve(-gain + 0.001 * rng.random(len(gain)), small, large)
    assert inverse.apgr < 0.1 and inverse.cpt(0.5) > 0.9


def test_bootstrap_intervals_and_degenerate_resamples():
    small, large, gain, rng = _outcomes(120, 0.15)
    rep = evaluate_router("perfect", gain + 0.001 * rng.random(len(gain)), small, large, resamples=1000)
    assert rep.apgr.low <= rep.apgr.value <= rep.apgr.high and rep.apgr.low > 0.85
    assert rep.cpt50.high <= 0.2 and rep.skipped_resamples == 0
    rand = evaluate_router("random", np.zeros(len(gain)), small, large, resamples=1000, random_scores=True)
    assert rand.apgr.value == 0.5 and rand.apgr.low < 0.5 < rand.apgr.high
    assert rep.apgr.low > rand.apgr.high
    d = rep.as_dict()
    assert set(d["pgr_at_share"]) == {f"{i}%" for i in range(0, 101, 10)} and json.dumps(d)
    # No gap at all: every resample is skipped and the intervals are undefined (null), not an error.
    none = evaluate_router("x", np.arange(10.0), np.ones(10), np.ones(10), resamples=50)
    assert none.skipped_resamples == 50 and none.as_dict()["apgr"]["ci95"] == [None, None]


def test_labels_round_trip_and_train(tmp_path):
    assert (label_of(True, False), label_of(False, True), label_of(False, False)) == (0, 1, None)
    from localspec.router.evaluation import Labelled

    examples = [Labelled(None, f"compute {' '.join(['9'] * k)} now", 256, int(k > 3)) for k in range(8) for _ in range(3)]
    path = tmp_path / "labels.jsonl"
    write_labels(path, examples)
    back = read_labels(path)
    assert back == examples
    policy = train_from_labels(back)
    assert not policy.uses_embedding and policy.meta["positives"] == 12


@pytest.mark.parametrize("row", [
    '{"prompt": "p", "max_tokens": "512", "label": 1}',  # log1p of a string, at training
    '{"prompt": "p", "max_tokens": true, "label": 1}',
    '{"messages": "hello", "label": 0}',  # a string's characters read as messages
    '{"messages": ["hello"], "label": 0}',
    '{"prompt": 7, "label": 0}',
])
def test_labels_of_the_wrong_type_are_a_config_error(tmp_path, row):
    """A labels file is user input: a field of the wrong type is named at its line, never a
    traceback later in training."""
    from localspec.errors import ConfigError

    path = tmp_path / "labels.jsonl"
    path.write_text(row + "\n")
    with pytest.raises(ConfigError, match=r"labels.jsonl:1: not a valid labelled example"):
        train_from_labels(read_labels(path))


# ---------------------------------------------------------------- the shipped figures


def test_eval_from_shipped_outcomes_reproduces_a_report(tmp_path, capsys):
    """`router eval --from-outcomes` on the committed outcome cache: no generation, full report."""
    from localspec.cli import main
    from localspec.router.tasks import shipped_outcomes

    assert shipped_outcomes().is_file()
    out = tmp_path / "report.json"
    rc = main(["router", "eval", "--from-outcomes", "--no-embedding", "--resamples", "200", "--out", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    # Default: 5-fold cross-validation, every task scored once by a policy that never saw it.
    assert report["tasks"] >= 120 and report["folds"] == 5 and report["held_out_tasks"] == report["tasks"]
    assert report["train_tasks"] == pytest.approx(report["tasks"] * 4 / 5, abs=1)
    assert set(report["routers"]) == {"learned", "heuristic", "cascade-confidence", "random"}
    small, large = report["tiers"]["small"]["quality"], report["tiers"]["large"]["quality"]
    assert large > small  # the gap the router works with
    learned = report["routers"]["learned"]
    assert learned["quality_at_share"]["0%"] == pytest.approx(small) and learned["quality_at_share"]["100%"] == pytest.approx(large)
    assert len(learned["apgr"]["ci95"]) == 2 and "goals" in report
    printed = capsys.readouterr().out
    assert "APGR" in printed and "CPT(50%)" in printed
    # --folds 1: the single 50/50 split, held-out and train halves disjoint. The old spelling
    # `--json PATH` still writes the file, with a deprecation note.
    out.unlink()
    rc = main(["router", "eval", "--from-outcomes", "--no-embedding", "--resamples", "50", "--folds", "1",
               "--json", str(out)])
    single = json.loads(out.read_text())
    assert rc == 0 and single["folds"] == 1
    assert f"--json {out} is deprecated; use --out {out}" in capsys.readouterr().err
    assert single["held_out_tasks"] + single["train_tasks"] == single["tasks"]


def test_an_answer_that_stopped_under_a_smaller_cap_stands_under_a_larger_one(tmp_path):
    """A greedy answer that ended on its own before its cap is the answer under any larger cap; one
    that was cut off is not, and is regenerated."""
    from localspec.router.outcomes import Outcome, OutcomeCache, outcome_key

    tasks = {t.id: t for t in load_tasks()}
    stopped, cut = tasks["code-001-reverse_words"], tasks["math-001"]
    cache = OutcomeCache(tmp_path / "outcomes.json")
    cache.put(outcome_key(stopped, "fp", 256), Outcome(stopped.id, "small", "m", True, 1.0, 25, -0.1, "stop", "ok"))
    cache.put(outcome_key(cut, "fp", 256), Outcome(cut.id, "small", "m", False, 9.0, 256, -0.4, "length", "cut"))
    assert cache.lookup(stopped, "fp", 512).completion_tokens == 25
    assert cache.lookup(cut, "fp", 512) is None
    assert cache.lookup(stopped, "other-model", 512) is None  # another model file: never reused
    assert cache.lookup(stopped, "fp", 128) is None  # a smaller cap than recorded: not known
    assert cache.find(stopped, "small", 512).passed and cache.find(stopped, "large", 512) is None
    assert cache.find(cut, "small", 512) is None
    # A prompt that changed since is not reused either.
    changed = Task(stopped.id, stopped.kind, stopped.prompt + " Be brief.", stopped.tests, stopped.answer)
    assert cache.lookup(changed, "fp", 512) is None and cache.find(changed, "small", 512) is None


# ---------------------------------------------------------------- generating outcomes (real model)


def _open_small(draft_path):
    """The small tier's engine as run_tier opens it: target alone, two slots."""
    from localspec.engine.config import EngineConfig
    from localspec.engine.scheduler import Engine
    from tests.common import TEST_THREADS

    config = EngineConfig(n_ctx=1024, n_threads=TEST_THREADS, mode="off", parallel=2)
    return Engine.load(str(draft_path), None, config)


@pytest.mark.models
def test_generate_answers_and_run_tier_with_the_small_model(draft_path, tmp_path):
    """Answers come back for every task with one logprob per token; a seeded sample repeats; and
    run_tier caches what it generated, so a second run opens no engine."""
    from localspec.engine.sampling import SamplingParams
    from localspec.router.outcomes import OutcomeCache, generate_answers, run_tier
    from tests.common import DRAFT_ID

    tasks = [t for t in load_tasks() if t.id.startswith(("code-001", "math-001", "code-002"))]
    assert len(tasks) == 3

    def open_small():
        return _open_small(draft_path)

    engine = open_small()
    try:
        greedy = sorted(generate_answers(engine, tasks, 12), key=lambda a: a.index)
        assert [a.index for a in greedy] == [0, 1, 2]
        for a in greedy:
            assert a.text and a.completion_tokens == len(a.token_logprobs) > 0
            assert all(lp <= 0.0 for lp in a.token_logprobs)
            assert a.mean_logprob == pytest.approx(sum(a.token_logprobs) / len(a.token_logprobs))
            assert a.finish_reason in ("stop", "length") and a.seconds > 0
        hot = SamplingParams(temperature=1.5, seed=7)
        first = {a.index: a.text for a in generate_answers(engine, tasks[:1], 12, hot)}
        again = {a.index: a.text for a in generate_answers(engine, tasks[:1], 12, hot)}
        assert first == again  # a fixed seed makes sampling repeatable
    finally:
        engine.close()

    cache = OutcomeCache(tmp_path / "outcomes.json")
    opened = []

    def opener():
        opened.append(1)
        return open_small()

    outs = run_tier("small", DRAFT_ID, draft_path, tasks, cache, 12, False, opener)
    assert [o.task_id for o in outs] == [t.id for t in tasks] and len(opened) == 1
    assert all(o.mean_logprob is not None and o.completion_tokens > 0 and o.text for o in outs)
    assert (tmp_path / "outcomes.json").is_file()
    again = run_tier("small", DRAFT_ID, draft_path, tasks, OutcomeCache(tmp_path / "outcomes.json"), 12, False, opener)
    assert len(opened) == 1 and [o.passed for o in again] == [o.passed for o in outs]


@pytest.mark.models
def test_a_larger_cap_regenerates_only_the_answers_that_were_cut_off(draft_path, tmp_path):
    """run_tier under a larger --max-tokens reuses the answers that stopped on their own, and those
    are the very texts a fresh run under the larger cap produces (greedy: the cap only ends it)."""
    from localspec.router.outcomes import OutcomeCache, run_tier
    from tests.common import DRAFT_ID

    tasks = [t for t in load_tasks() if t.id.startswith(("code-001", "math-001"))]

    def open_small():
        return _open_small(draft_path)

    cache = OutcomeCache(tmp_path / "outcomes.json")
    first = {o.task_id: o for o in run_tier("small", DRAFT_ID, draft_path, tasks, cache, 40, False, open_small)}
    reasons = {o.finish_reason for o in first.values()}
    assert reasons == {"stop", "length"}, reasons  # reverse_words fits in 40 tokens, a worked sum does not
    larger = {o.task_id: o for o in run_tier("small", DRAFT_ID, draft_path, tasks, cache, 56, False, open_small)}
    caps = sorted(k.rsplit("|", 1)[1] for k in cache.entries)
    assert caps == ["40", "40", "56"]  # only the cut-off answer was generated again
    for task_id, o in first.items():
        if o.finish_reason == "stop":
            assert larger[task_id] == o
            fresh = run_tier("small", DRAFT_ID, draft_path, [t for t in tasks if t.id == task_id],
                             OutcomeCache(tmp_path / "fresh.json"), 56, False, open_small)
            assert fresh[0].text == o.text and fresh[0].finish_reason == "stop"
        else:
            assert larger[task_id].completion_tokens > o.completion_tokens
