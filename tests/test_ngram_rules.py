"""localspec.bench.ngram_rules: llama-server's n-gram drafters as rules over a recorded answer."""

from __future__ import annotations

from localspec.bench.ngram_rules import NgramMapK, NgramMod, ngram_simple, price, price_rules

TEXT = list(range(100, 200))  # 100 distinct tokens: every n-gram in it occurs once


def test_ngram_simple_copies_after_the_latest_12_token_match_and_nothing_on_shorter_ones():
    history = TEXT + [7, 8] + TEXT[:12]  # the last 12 tokens occurred at the start
    assert ngram_simple(history) == TEXT[12:60]  # the 48 tokens after the match
    assert ngram_simple(TEXT + [7, 8] + TEXT[1:12]) == []  # 11 tokens match: not 12
    assert ngram_simple(TEXT[:20] + [7] + TEXT[:12]) == []  # a history of at most n + m + 1 tokens: nothing


def test_ngram_map_k_drafts_no_more_from_a_key_than_its_last_draft_kept():
    rule = NgramMapK()
    history = TEXT + [7] + TEXT[:12]
    assert rule.draft(history) == TEXT[12:60]
    rule.observe(5)
    assert rule.draft(history) == TEXT[12:17]
    rule.observe(0)
    assert rule.draft(history) == []  # a key whose copy failed at once drafts nothing again


def test_ngram_mod_drafts_only_chains_of_48_tokens_or_more():
    rule = NgramMod()
    rule.begin(TEXT)
    assert rule.draft(TEXT + [7] + TEXT[:24]) == TEXT[24:88]  # a 64-token chain from the 24-token context
    short = NgramMod(n=4, m_min=8, m_max=10)
    short.begin(TEXT[:9])
    assert short.draft(TEXT[:9] + [7] + TEXT[:4]) == []  # 5 tokens chain on from the 4-token context: under 8
    short.begin(TEXT[:30])
    assert short.draft(TEXT[:30] + [7] + TEXT[:4]) == TEXT[4:14]  # 26 chain on: m_max of them


def test_a_rule_is_priced_in_single_steps_on_the_curve():
    prompt, answer = TEXT + [7], TEXT[:80]
    flat = price(prompt, answer, lambda n: 1.0 + 0.01 * n, ngram_simple)
    steep = price(prompt, answer, lambda n: float(n), ngram_simple)
    assert flat.speedup > 2.0 and flat.kept == flat.drafted > 0
    assert steep.speedup <= 1.0 + 1e-9  # n rows at n steps: no draft can pay
    assert set(price_rules(prompt, answer, lambda n: float(n))) == {"ngram-simple", "ngram-map-k", "ngram-mod"}
