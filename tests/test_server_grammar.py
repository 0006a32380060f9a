"""The engine's grammar filter (used by response_format and tools) and per-token logprobs.

Uses the small draft model's vocabulary: the filter only needs a tokenizer.
"""

from __future__ import annotations

import numpy as np
import pytest
from llama_cpp.llama_grammar import json_schema_to_gbnf

from localspec.engine.grammar import Grammar
from localspec.engine.runtime import ModelRuntime, RuntimeConfig
from localspec.engine.slots import token_logprob as _logprob
from localspec.errors import RequestError
from tests.common import TEST_THREADS


@pytest.fixture(scope="module")
def rt(draft_path):
    runtime = ModelRuntime(draft_path, RuntimeConfig(n_ctx=64, n_threads=TEST_THREADS))
    yield runtime
    runtime.close()


def grammar(rt, gbnf: str) -> Grammar:
    return Grammar.compile(rt._vocab, rt.n_vocab, gbnf, rt.eos)


def tok(rt, text: str) -> int:
    ids = rt.tokenize(text, add_special=False, parse_special=False)
    assert len(ids) == 1, ids
    return ids[0]


def test_bad_grammar_is_a_request_error(rt):
    with pytest.raises(RequestError, match="grammar"):
        grammar(rt, "root ::= (")


def test_best_skips_refused_tokens(rt):
    g = grammar(rt, 'root ::= "yes" | "no"')
    row = np.zeros(rt.n_vocab, dtype=np.float32)
    row[tok(rt, "maybe")] = 10.0  # the model's favourite, which the grammar refuses
    row[tok(rt, "no")] = 5.0
    row[tok(rt, "yes")] = 4.0
    assert g.best(row) == tok(rt, "no")
    assert not g.allows(tok(rt, "maybe")) and g.allows(tok(rt, "yes"))
    # Refused everywhere in the top candidates: the whole vocabulary is searched.
    row2 = np.zeros(rt.n_vocab, dtype=np.float32)
    refused = [t for t in range(1000, 2000) if not g.allows(t)][:100]  # more than one round of candidates
    row2[refused] = 9.0
    row2[tok(rt, "yes")] = 1.0
    assert g.best(row2) == tok(rt, "yes")
    g.close()


def test_mask_matches_allows_and_completion_allows_only_end(rt):
    g = grammar(rt, 'root ::= "yes" | "no"')
    masked = g.mask(np.zeros(rt.n_vocab, dtype=np.float32))
    allowed = np.flatnonzero(np.isfinite(masked))
    assert tok(rt, "yes") in allowed and tok(rt, "no") in allowed
    assert all(g.allows(int(t)) for t in allowed[:20])
    clone = g.clone()
    clone.accept(tok(rt, "yes"))
    after = np.flatnonzero(np.isfinite(clone.mask(np.zeros(rt.n_vocab, dtype=np.float32))))
    assert len(after) > 0 and all(rt.is_eog(int(t)) for t in after)
    assert rt.is_eog(clone.best(np.zeros(rt.n_vocab, dtype=np.float32)))
    assert g.allows(tok(rt, "no"))  # the clone's progress did not touch the original
    clone.close()
    g.close()


def test_json_schema_grammar_walks_a_valid_object(rt):
    g = grammar(rt, json_schema_to_gbnf('{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}'))
    for t in rt.tokenize('{"n": 42}', add_special=False, parse_special=False):
        assert g.allows(t)
        g.accept(t)
    assert not g.allows(tok(rt, "hello"))
    g.close()


def test_logprob_is_log_softmax_with_sorted_alternatives():
    row = np.array([1.0, 3.0, 2.0, -1.0], dtype=np.float32)
    lp = _logprob(row, 2, 2)
    expected = row - np.log(np.exp(row).sum())
    assert lp.token == 2 and lp.logprob == pytest.approx(expected[2])
    assert [t for t, _ in lp.top] == [1, 2]
    assert lp.top[0][1] == pytest.approx(expected[1])
    assert _logprob(row, 0, 0).top == ()
