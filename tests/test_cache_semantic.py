"""The cache with the real MiniLM embedder: semantic hits, guard, scope, index recovery, CLI eval."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from localspec.cache import CacheScope, SemanticCache
from localspec.cli import main
from localspec.engine.embedder import Embedder


def scope(system: str = "You are helpful.", turns: list | None = None) -> CacheScope:
    return CacheScope.from_request(model_hash="m", system_prompt=system, earlier_turns=turns or [],
                                   sampling={"temperature": 0.0})


def test_embedder_matches_reference_similarity(embedder: Embedder) -> None:
    a = embedder.embed("How do I reverse a list in Python?")
    b = embedder.embed("What's the way to reverse a Python list?")
    c = embedder.embed("What is the capital of Australia?")
    assert a.shape == (384,) and a.dtype == np.float32
    assert abs(float(np.linalg.norm(a)) - 1.0) < 1e-4
    assert abs(float(a @ b) - 0.973) < 0.01  # the value in ../shared/models/README.md
    assert float(a @ c) < 0.5


def test_text_over_the_window_is_refused_not_sent(embedder: Embedder) -> None:
    long_text = "word " * 600
    assert not embedder.fits(long_text)
    assert embedder.embed(long_text) is None  # llama.cpp would abort the process on this


def test_semantic_hit_and_guarded_traps(tmp_path: Path, embedder: Embedder) -> None:
    with SemanticCache(tmp_path / "c", embedder=embedder) as c:
        assert c.mode == "semantic"
        c.store(scope(), "How do I reverse a list in Python?", "use reversed()", [1, 2])
        c.store(scope(), "How do I sort a list of numbers in ascending order in Python?", "sorted(xs)", [3])
        c.store(scope(), "What is the sum of 3 and 4?", "7", [4])
        hit = c.lookup(scope(), "What's the way to reverse a Python list?")
        assert hit is not None and hit.kind == "semantic" and hit.answer == "use reversed()"
        assert 0.9 < hit.similarity < 1.0 and hit.matched_prompt == "How do I reverse a list in Python?"
        assert c.lookup(scope(), "How do I sort a list of numbers in descending order in Python?") is None
        assert c.lookup(scope(), "What is the sum of 3 and 5?") is None
        assert c.lookup(scope(), "How do I reverse a list in JavaScript?") is None
        assert c.stats()["guard_rejections"] >= 1  # "descending" scores ~0.95 against "ascending"


def test_scope_blocks_semantic_hits(tmp_path: Path, embedder: Embedder) -> None:
    with SemanticCache(tmp_path / "c", embedder=embedder) as c:
        c.store(scope(), "How do I reverse a list in Python?", "use reversed()", [])
        q = "What's the way to reverse a Python list?"
        assert c.lookup(scope(system="Answer in French."), q) is None
        assert c.lookup(scope(turns=[{"role": "user", "content": "I use Python 2"}]), q) is None
        assert c.lookup(scope(), q) is not None


def test_long_prompt_is_exact_match_only(tmp_path: Path, embedder: Embedder) -> None:
    long_prompt = "Summarise this log: " + "error at line 12; " * 200
    with SemanticCache(tmp_path / "c", embedder=embedder) as c:
        c.store(scope(), long_prompt, "summary", [])
        assert c.lookup(scope(), long_prompt).kind == "exact"
        assert c.lookup(scope(), long_prompt + " Please.") is None
        assert c.stats()["too_long"] == 1


def test_index_lost_or_corrupt_is_rebuilt_from_entries(tmp_path: Path, embedder: Embedder, caplog) -> None:
    d = tmp_path / "c"
    with SemanticCache(d, embedder=embedder) as c:
        c.store(scope(), "How do I reverse a list in Python?", "use reversed()", [])
    assert (d / "vectors.npy").exists()
    (d / "vectors.npy").write_bytes(b"garbage")
    with caplog.at_level(logging.WARNING, logger="localspec.cache"), SemanticCache(d, embedder=embedder) as c:
        assert c.lookup(scope(), "What's the way to reverse a Python list?") is not None
    assert any("rebuilding" in r.message for r in caplog.records)
    (d / "vectors.npy").unlink()
    (d / "vectors.json").unlink()
    with SemanticCache(d, embedder=embedder) as c:
        assert c.lookup(scope(), "What's the way to reverse a Python list?") is not None


def test_silently_evicted_entry_is_not_served(tmp_path: Path, embedder: Embedder) -> None:
    with SemanticCache(tmp_path / "c", embedder=embedder) as c:
        c.store(scope(), "How do I reverse a list in Python?", "use reversed()", [])
        c._store._dc.clear()  # diskcache evicting behind the index's back
        assert c.lookup(scope(), "What's the way to reverse a Python list?") is None
        assert c.stats()["evicted_on_hit"] == 1


def test_cli_eval_on_a_slice(embedder: Embedder, minilm_path: Path, capsys) -> None:
    rc = main(["cache", "eval", "--split", "dev", "--limit", "24", "--embedding-model", str(minilm_path), "--cache-judge",
               "rules", "--json"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert report["pairs"] == 24 and report["mode"] == "semantic" and report["judge"] is None
    assert len(report["curve"]) == 20
    assert report["at_threshold"]["false_hits"] == 0
    assert report["latency_ms"]["lookup_p50"] > 0
    assert report["goals"] == {"hit_rate": 0.8, "false_hit_rate": 0.01, "met": report["goals"]["met"]}


def test_cli_eval_text_report_on_a_file(tmp_path: Path, capsys) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("\n".join(json.dumps(p) for p in [
        {"a": "How do I reverse a list in Python?", "b": "how do i reverse a list in python", "label": "hit"},
        {"a": "What is the sum of 3 and 4?", "b": "What is the sum of 3 and 5?", "label": "miss"},
    ]) + "\n")
    rc = main(["cache", "eval", "--file", str(pairs), "--exact-only", "--misses"])
    out = capsys.readouterr().out
    assert rc == 0 and "threshold  hit rate" in out and "exact mode" in out
    assert "lookup latency over 2 real lookups: p50" in out and "suggested threshold" in out
    assert "goals at" in out and ": met" in out  # the exact paraphrase is served, the trap is not


def test_cli_stats_clear_export(tmp_path: Path, capsys) -> None:
    with SemanticCache() as c:  # the default directory under the (isolated) cache dir
        c.store(scope(), "q", "a", [])
    assert main(["cache", "stats", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["entries"] == 1
    # The command loads no embedding model: it claims no mode ("no embedding model installed" was false
    # with MiniLM installed), nor an index count it did not read.
    assert not {"mode", "description", "indexed"} & set(report)
    assert main(["cache", "export", str(tmp_path / "x.jsonl")]) == 0
    assert (tmp_path / "x.jsonl").read_text().count("\n") == 1
    assert main(["cache", "clear"]) == 0
    assert "removed 1" in capsys.readouterr().out
