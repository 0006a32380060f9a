"""The pair scorer (`--cache-judge scorer`) with the real MiniLM: shipped weights, training, the cache."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from localspec.cache import SemanticCache
from localspec.cache.evaluate import load_pairs, pair_files
from localspec.cache.scorer import (
    THRESHOLDS, PairScorer, ScorerJudge, reworded, reworded_pairs, train_scorer, training_pairs,
)
from localspec.cli import main
from localspec.engine.embedder import Embedder
from tests.common import plain_scope

# Rewordings the shipped weights must serve, and traps they must refuse even where the guard's
# facts-only rules let them through (none of these texts is in the pair sets).
SERVED = [
    ("How do I reverse a list in Python?", "How can I reverse a list in Python?"),
    ("How do I reverse a list in Python?", "python reverse list"),
    ("How do I read a file line by line in Python?", "Read a file line by line in Python"),
]
REFUSED = [
    ("How do I reverse a list in Python?", "How do I sort a list in Python?"),
    ("How do I delete a git branch?", "How do I delete a remote git branch?"),
    ("What's the boiling point of water?", "What is the boiling point of water in Fahrenheit?"),
]


def test_shipped_weights_fit_minilm_and_no_other_model(embedder: Embedder) -> None:
    scorer = PairScorer.load()
    assert scorer.fits(embedder) and scorer.threshold in THRESHOLDS
    assert scorer.report["chosen"]["false_hit_rate"] <= 0.005  # its held-out figure, as trained
    other = dataclasses.replace(scorer, fingerprint="0" * 32, embedding_model="some-other-embedder")
    with pytest.raises(ValueError, match="some-other-embedder"):
        ScorerJudge(other, embedder)


def test_shipped_weights_serve_rewordings_and_refuse_traps(embedder: Embedder) -> None:
    judge = ScorerJudge(PairScorer.load(), embedder)
    for saved, new in SERVED:
        ok, score = judge.agrees(saved, new)
        assert ok and score >= judge.threshold, (saved, new, score)
    for saved, new in REFUSED:
        ok, score = judge.agrees(saved, new)
        assert not ok and score < judge.threshold, (saved, new, score)
    assert judge.score("x" * 10, "word " * 600) == -np.inf  # over the embedder's window: never a hit


def test_weights_round_trip_and_bad_files_are_refused(tmp_path: Path, embedder: Embedder) -> None:
    scorer = PairScorer.load()
    path = tmp_path / "w.json"
    scorer.save(path)
    again = PairScorer.load(path)
    u, v = embedder.embed(SERVED[0][0]), embedder.embed(SERVED[0][1])
    assert again.log_odds(u, v, *SERVED[0]) == pytest.approx(scorer.log_odds(u, v, *SERVED[0]), abs=1e-3)
    raw = json.loads(path.read_text())
    for broken in ({**raw, "format": "something-else"}, {**raw, "coef": raw["coef"][:-1]}, [1, 2]):
        with pytest.raises(ValueError):
            PairScorer.from_json(broken)


def test_the_cache_serves_what_the_scorer_agrees_to_and_remembers_it(tmp_path: Path, embedder: Embedder) -> None:
    cache = SemanticCache(tmp_path, embedder=embedder, ttl_s=None)
    judge = ScorerJudge(PairScorer.load(), embedder)
    try:
        for saved, _ in SERVED[:1] + REFUSED:
            cache.store(plain_scope(), saved, f"answer to {saved}", [1])
        hit = cache.lookup(plain_scope(), SERVED[0][1], judge=judge)
        assert hit is not None and hit.kind == "semantic" and hit.matched_prompt == SERVED[0][0]
        assert hit.judged_by == judge.name and hit.judged_by.startswith("pair-scorer:")
        assert hit.judge >= judge.threshold and not hit.remembered
        again = cache.lookup(plain_scope(), SERVED[0][1], judge=judge)
        assert again is not None and again.remembered and again.entry_id == hit.entry_id
        for _saved, new in REFUSED:
            assert cache.lookup(plain_scope(), new, judge=judge) is None, new
        stats = cache.stats()
        assert stats["judged"] >= 2 and stats["judge_rejections"] >= 1 and stats["remembered_verdicts"] == 1
    finally:
        cache.close()


def test_training_chooses_the_threshold_on_a_source_the_fit_did_not_see(embedder: Embedder) -> None:
    rows = [dict(r, source=f.stem) for f in pair_files("dev") for r in load_pairs(f)[:150]]
    made_up = reworded_pairs(rows)
    assert made_up and all(p["label"] == "hit" and p["b"] != p["a"] for p in made_up)
    vectors = {}

    def vec(text: str):
        if text not in vectors:
            vectors[text] = embedder.embed(text)
        return vectors[text]

    pairs = training_pairs(rows + made_up, vec)
    scorer = train_scorer(pairs, vec, embedder.fingerprint, "minilm")
    report = scorer.report
    assert report["pairs"] == 300 and report["made_up"] == len(made_up)  # made-up pairs are never counted
    assert report["sources"] == ["pairs_dev", "pairs_dev_blind"]
    chosen = report["chosen"]
    assert chosen["false_hit_rate"] <= 0.005 and scorer.threshold == chosen["threshold"] in THRESHOLDS
    curve = report["held_out_curves"][str(chosen["l2"])]
    assert max(p["hit_rate"] for p in curve if p["false_hit_rate"] <= 0.005) == chosen["hit_rate"]
    assert scorer.fits(embedder)
    one_author = [p for p in pairs if p.source == "pairs_dev"]
    with pytest.raises(ValueError, match="two sources"):
        train_scorer(one_author, vec, embedder.fingerprint)


def test_rewording_is_reproducible_and_keeps_the_request() -> None:
    text = "How do I reverse a list in Python?"
    assert reworded(text) == reworded(text) != text
    assert "reverse a list in Python" in reworded(text)


def test_cli_eval_with_the_scorer_and_training_errors(minilm_path: Path, tmp_path: Path, capsys) -> None:
    rc = main(["cache", "eval", "--split", "dev", "--limit", "30", "--embedding-model", str(minilm_path),
               "--cache-judge", "scorer", "--json"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert report["judge"]["model"].startswith("pair-scorer:")
    assert report["judge"]["threshold"] == PairScorer.load().threshold
    assert report["latency_ms"]["timed_lookups"] == 30  # every lookup is timed: no prefill to spare
    assert [p["threshold"] for p in report["judge_curve"]] == list(THRESHOLDS)
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"a": "x", "b": "y", "label": "hit"}) + "\n")
    assert main(["cache", "train-scorer", "--file", str(one), "--out", str(tmp_path / "w.json")]) != 0
    assert "at least two pair files" in capsys.readouterr().err

