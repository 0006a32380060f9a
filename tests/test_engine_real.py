"""The engine with the real Qwen2.5-Coder 1.5B target and 0.5B draft (Q4_K_M).

Greedy losslessness: speculative output must equal target-only output token for token. llama.cpp
computes a batch of rows with different kernels than a single row, so logits differ in the last
bits; where two candidates are (nearly) tied, that can flip the argmax. A divergence is therefore
accepted only where the test proves it is such a tie: the target's top two logits at that position
are within NEAR_TIE of each other. Anything else fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from pydantic import ValidationError
from scipy import stats as sps

from localspec.engine.chat import ChatMessage
from localspec.engine.config import MAX_DRAFT_K, EngineConfig, GenerationRequest
from localspec.engine.drafters import common_prefix
from localspec.engine.events import Done, Token
from localspec.engine.prediction import prepare
from localspec.engine.runtime import ModelRuntime, Row, RuntimeConfig
from localspec.engine.sampling import SamplingParams, distribution
from localspec.engine.scheduler import Engine
from localspec.errors import ContextOverflowError, IncompatibleDraftError, LocalspecError
from tests.common import REPO, TEST_THREADS

# Logit units. On this CPU build the same history decoded as one batch or token by token gives
# logits that differ by up to ~0.6 (mean ~0.09); see test_kv_cache_consistent_... for the control.
NEAR_TIE = 0.5
# Each divergence is proven a near-tie below; this guards the test's power: the compared prefixes
# (up to the first divergence) must still cover most of the generated tokens.
MIN_COMPARED_SHARE = 0.5
ALPHA = 1e-3 / 2  # Bonferroni: the statistical tests in this file

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Write a JavaScript function that debounces another function.",
    "Explain what a mutex is in two sentences.",
    "Write a SQL query that returns the ten most recent orders with their customer names.",
    "Implement binary search in C.",
    "Write a bash one-liner that counts lines in all .py files under the current directory.",
    "Convert this to a list comprehension:\nresult = []\nfor x in range(10):\n    if x % 2 == 0:\n        result.append(x * x)",
    "What is the difference between a process and a thread?",
    "Write a Rust function that reverses a string.",
    "Add type hints to this function:\ndef merge(a, b):\n    out = dict(a)\n    out.update(b)\n    return out",
    "Write a haiku about compilers.",
]


@pytest.fixture(scope="module")
def engine(target_path, draft_path):
    eng = Engine.load(str(target_path), str(draft_path), EngineConfig(n_ctx=2048, n_threads=TEST_THREADS))
    yield eng
    eng.close()


def chat(text: str, **kw) -> GenerationRequest:
    return GenerationRequest(messages=[ChatMessage(role="user", content=text)], **kw)


def run(engine: Engine, request: GenerationRequest) -> tuple[list[int], Done, list[Token]]:
    ids, tokens, done = [], [], None
    for ev in engine.generate(request):
        if isinstance(ev, Token):
            ids.extend(ev.ids)
            tokens.append(ev)
        else:
            done = ev
    return ids, done, tokens


def fresh_logits(engine: Engine, history: list[int]) -> np.ndarray:
    """Next-token logits of `history` from an empty KV cache (sequence slot 0, then cleared)."""
    rt = engine.target
    rt.seq_rm(0, 0, -1)
    engine.slots[0].kv.clear()
    rows = [Row(t, i, 0, logits=(i == len(history) - 1)) for i, t in enumerate(history)]
    out = rt.decode(rows)[-1]
    rt.seq_rm(0, 0, -1)
    return out


def assert_same_or_near_tie(engine, prompt_ids, ref, got, label):
    if got == ref:
        return len(ref)
    n = min(len(ref), len(got))
    j = next((i for i in range(n) if ref[i] != got[i]), n)
    if j == n:  # one is a prefix of the other: only an early EOS/stop would do that
        pytest.fail(f"{label}: output length differs ({len(got)} vs {len(ref)}) without a token difference")
    logits = fresh_logits(engine, prompt_ids + ref[:j])
    top2 = np.sort(logits)[-2:]
    gap = float(top2[1] - top2[0])
    assert {ref[j], got[j]} <= set(np.argsort(logits)[-2:].tolist()), f"{label}: diverged at {j} on a non-top-2 token"
    assert gap < NEAR_TIE, f"{label}: diverged at token {j} but the target's top-2 gap is {gap:.3f} (not a near-tie)"
    print(f"{label}: near-tie at token {j} (top-2 gap {gap:.3f})")
    return j


@pytest.mark.models
def test_greedy_draft_and_lookup_match_target_only(engine):
    accepted = drafted = 0
    compared = {"draft": 0, "lookup": 0}
    total = 0
    for prompt in PROMPTS:
        req = chat(prompt, max_tokens=48)
        prompt_ids, _ = engine.prompt_tokens(req)
        ref, done_ref, _ = run(engine, req.model_copy(update={"mode": "off"}))
        assert done_ref.stats.drafted == 0
        total += len(ref)
        for mode in ("draft", "lookup"):
            got, done, _ = run(engine, req.model_copy(update={"mode": mode}))
            compared[mode] += assert_same_or_near_tie(engine, prompt_ids, ref, got, f"{mode} on {prompt[:30]!r}")
            if mode == "draft":
                accepted += done.stats.accepted
                drafted += done.stats.drafted
    assert min(compared.values()) >= MIN_COMPARED_SHARE * total, (compared, total)
    # The real pair agrees on code most of the time; the brief's bar is 0.8 on code prompts.
    assert drafted > 0 and accepted / drafted >= 0.8, f"acceptance {accepted}/{drafted}"


# Text that repeats: prompt lookup finds long matches in it, so it proposes drafts of many tokens.
REPEATING = ("Repeat the following paragraph exactly, twice:\n\n" + "The quick brown fox jumps over the lazy dog "
             "while the careful engineer checks every row of the output buffer before the batch is decoded. " * 3)


@pytest.mark.models
@pytest.mark.parametrize("k", [16, MAX_DRAFT_K])
def test_long_lookup_drafts_are_served_and_match_target_only(engine, k):
    """A draft of k tokens needs k + 1 logits rows in one verification; the context serves them (the
    issue: `generate --mode lookup -k 16` failed mid-answer with 17 rows against 16)."""
    req = GenerationRequest(prompt=REPEATING, max_tokens=96, mode="lookup", k=k)
    prompt_ids, _ = engine.prompt_tokens(req)
    ref, done_ref, _ = run(engine, req.model_copy(update={"mode": "off", "k": None}))
    got, done, _ = run(engine, req)
    assert done.finish_reason in ("stop", "length") and done.error is None
    assert len(done.stats.drafted_by_position) >= 16, "no long draft was proposed: the test lost its power"
    assert_same_or_near_tie(engine, prompt_ids, ref, got, f"lookup k={k}")


@pytest.mark.models
def test_a_request_asked_again_drafts_its_earlier_answer_from_its_owner_history_only(engine):
    """Lookup over finished requests (like llama-server's ngram-mod pool): the same question again
    copies its earlier answer, verified like any draft; another owner's history stays out."""
    # A prompt with no near-tie in its first 48 tokens: one there parts the answers and leaves
    # nothing to compare (PROMPTS[4] has one at token 4 since its last prompt token is read alone).
    req = chat(PROMPTS[3], max_tokens=48, mode="lookup", k=48, history_scope="test-owner-a")
    prompt_ids, _ = engine.prompt_tokens(req)
    first, done_first, _ = run(engine, req)
    again, done_again, _ = run(engine, req)
    other, done_other, _ = run(engine, req.model_copy(update={"history_scope": "test-owner-b"}))
    print("accepted: first", done_first.stats.accepted, "again", done_again.stats.accepted,
          "other owner", done_other.stats.accepted, "of", len(first))
    # Up to a proven near-tie (batch float differences) the answers agree; that much is copied.
    shared = assert_same_or_near_tie(engine, prompt_ids, first, again, "asked again")
    assert shared >= MIN_COMPARED_SHARE * len(first), "the answers parted early: the test lost its power"
    assert done_again.stats.accepted >= 0.8 * shared - 1
    assert_same_or_near_tie(engine, prompt_ids, first, other, "another owner")
    # b's lookup saw its own sequence only: it copies far less than a's second request.
    assert done_other.stats.accepted <= done_again.stats.accepted - 0.4 * shared


@pytest.mark.models
def test_an_answer_asked_again_equals_the_target_alone_through_near_ties_its_batches_read_otherwise(engine):
    """Prompts whose answers hold near-ties (PROMPTS[4]'s at token 4): the first answer is the target alone
    (plain steps); asked again, it is copied in passes of up to 49 rows, whose kernels decide some of those
    ties the other way (16 in 11 answers of 96 tokens, by up to 0.19 logits, 2026-12-07). Each such row
    follows the earlier answer's pick (verify.settle_near_ties), so the copy is `off`'s answer token for token."""
    settled = 0
    for i in (4, 5, 7):
        req = chat(PROMPTS[i], max_tokens=64, mode="off", history_scope=f"test-ties-{i}")
        first, _, _ = run(engine, req)
        again, done, _ = run(engine, req.model_copy(update={"mode": "lookup", "k": 48}))
        print(f"prompt {i}: {done.stats.near_ties_settled} near-ties settled, {done.stats.accepted} of "
              f"{done.stats.drafted} drafted tokens kept")
        assert done.stats.drafted >= len(first) - 4, "the earlier answer was not copied: the test lost its power"
        assert again == first
        settled += done.stats.near_ties_settled
    assert settled > 0, "no tie went the other way in a long pass: the test lost its power"


@pytest.mark.models
def test_a_step_with_more_logits_rows_than_the_context_serves_is_split(draft_path):
    """The runtime splits a batch at n_outputs_max logits rows (slots together may ask for more than
    one verification's worth); the parts give exactly the rows of the same batches decoded by hand."""
    rt = ModelRuntime(draft_path, RuntimeConfig(n_ctx=256, n_batch=64, n_ubatch=64, n_outputs_max=4,
                                                n_threads=TEST_THREADS))
    try:
        tokens = rt.tokenize("def fibonacci(n):\n    if n < 2:\n        return n\n    return")
        rows = [Row(t, i, 0, logits=True) for i, t in enumerate(tokens)]
        assert len(rows) > 2 * rt.config.n_outputs_max
        got = rt.decode(rows)
        rt.seq_rm(0, 0, -1)
        by_hand = np.concatenate([rt.decode(rows[i : i + 4]) for i in range(0, len(rows), 4)])
        rt.seq_rm(0, 0, -1)
        assert got.shape == (len(rows), rt.n_vocab)
        assert np.array_equal(got, by_hand)
    finally:
        rt.close()


@pytest.mark.models
def test_generate_cli_lookup_k16_succeeds(target_path, draft_path, isolated_home):
    """The issue's command: `localspec generate --mode lookup -k 16` answers (it exited 1 with
    finish_reason "error"), and as mode off does."""
    def generate(*mode: str) -> dict:
        proc = subprocess.run(
            [sys.executable, "-m", "localspec", "generate", REPEATING, "--json", "--no-pull", "--max-tokens", "64",
             "--threads", str(TEST_THREADS), "--n-ctx", "1024", *mode],
            cwd=REPO, env=dict(os.environ, LOCALSPEC_HOME=str(isolated_home)), capture_output=True, text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout)

    spec = generate("--mode", "lookup", "-k", "16")
    assert spec["finish_reason"] in ("stop", "length")
    assert len(spec["stats"]["drafted_by_position"]) >= 16
    off = generate("--mode", "off")
    assert off["finish_reason"] in ("stop", "length")


def test_a_draft_longer_than_the_maximum_is_refused_before_anything_runs(isolated_home):
    with pytest.raises(ValidationError):
        GenerationRequest(prompt="x", k=MAX_DRAFT_K + 1)
    with pytest.raises(ValidationError):
        EngineConfig(lookup_k=MAX_DRAFT_K + 1)
    proc = subprocess.run(  # no model is loaded: the request is checked first
        [sys.executable, "-m", "localspec", "generate", "x", "--no-pull", "--mode", "lookup", "-k",
         str(MAX_DRAFT_K + 1), "--model", "no-such-model"],
        cwd=REPO, env=dict(os.environ, LOCALSPEC_HOME=str(isolated_home)), capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and "no-such-model" not in proc.stderr
    first = proc.stderr.strip().splitlines()[0]
    assert "k" in first and str(MAX_DRAFT_K) in first


@pytest.mark.models
def test_the_real_chat_template_passes_the_load_probe(engine):
    verdict = engine.chat_check.verdict()
    assert verdict.ok, verdict.reason


@pytest.mark.models
def test_sampled_verify_token_matches_target_distribution(engine):
    """At T=1 the second token (the first one verification produces) is distributed as p."""
    params = dict(temperature=1.0, top_k=40)
    req = chat("Write one sentence about the ocean.", max_tokens=2, mode="draft", k=3)
    prompt_ids, _ = engine.prompt_tokens(req)
    first_counts: dict[int, int] = {}
    seconds: dict[int, list[int]] = {}
    n_runs = 300
    for seed in range(n_runs):
        r = req.model_copy(update={"sampling": SamplingParams(seed=seed, **params)})
        ids, done, _ = run(engine, r)
        assert len(ids) == 2 and done.stats.target_passes >= 1
        first_counts[ids[0]] = first_counts.get(ids[0], 0) + 1
        seconds.setdefault(ids[0], []).append(ids[1])
    t1 = max(first_counts, key=first_counts.get)
    sample = seconds[t1]
    assert len(sample) >= 100, f"first token too spread out: {first_counts}"
    p = distribution(fresh_logits(engine, prompt_ids + [t1]), SamplingParams(**params), prompt_ids + [t1])
    top = np.argsort(p)[::-1][:6].tolist()
    observed = [sum(1 for t in sample if t == tok) for tok in top] + [sum(1 for t in sample if t not in top)]
    expected = [p[tok] * len(sample) for tok in top] + [(1 - p[top].sum()) * len(sample)]
    # Merge cells too small for chi-square into "other".
    keep = [i for i in range(len(top)) if expected[i] >= 5]
    obs = [observed[i] for i in keep] + [len(sample) - sum(observed[i] for i in keep)]
    exp = [expected[i] for i in keep] + [len(sample) - sum(expected[i] for i in keep)]
    if exp[-1] < 5:
        obs, exp = obs[:-2] + [obs[-2] + obs[-1]], exp[:-2] + [exp[-2] + exp[-1]]
    if len(obs) < 2:
        pytest.skip("the target is (almost) deterministic here; nothing to test")
    assert sps.chisquare(obs, exp).pvalue > ALPHA, f"observed {obs} expected {np.round(exp, 1)}"


@pytest.mark.models
def test_kv_cache_consistent_after_draft_reject_cycles(engine):
    """After many draft/reject/rollback cycles the KV cache holds exactly the accepted history.

    Logits from that cache are compared with a fresh prefill of the same history. Batched and
    single-row kernels differ in the last bits, so the yardstick is a control: the same history
    decoded one token at a time, as target-only decoding would. A bookkeeping error (a stale or
    missing cell) shifts logits by whole units and changes the argmax; noise stays at the control's level.
    """
    req = chat("Write a short story about a robot learning to paint.", max_tokens=80, mode="draft", k=5,
               sampling=SamplingParams(temperature=1.0, seed=7))
    ids, done, _ = run(engine, req)
    assert done.stats.drafted > done.stats.accepted > 0, "need both accepts and rejects"
    prompt = engine.prompt_tokens(req)[0]
    history = prompt + ids
    slot = engine.slots[0]
    assert slot.kv == history[: len(slot.kv)] and len(slot.kv) >= len(history) - 1
    assert engine.target.seq_pos_max(0) == len(slot.kv) - 1  # llama.cpp holds as many cells as we think
    rest = history[len(slot.kv):] or history[-1:]
    if not history[len(slot.kv):]:
        engine.target.seq_rm(0, len(history) - 1, -1)
        del slot.kv[len(history) - 1:]
    start = len(slot.kv)
    cached = engine.target.decode([Row(t, start + i, 0, logits=(i == len(rest) - 1)) for i, t in enumerate(rest)])[-1]
    fresh = fresh_logits(engine, history)
    # Control: prompt prefill, then the generated tokens one by one.
    rt = engine.target
    rt.decode([Row(t, i, 0) for i, t in enumerate(prompt)])
    for i in range(len(prompt), len(history)):
        control = rt.decode([Row(history[i], i, 0, logits=True)])[-1]
    rt.seq_rm(0, 0, -1)
    noise = np.abs(control - fresh)
    diff = np.abs(cached - fresh)
    top2 = np.argsort(fresh)[-2:]
    gap = float(fresh[top2[1]] - fresh[top2[0]])
    # The argmax may differ only where the fresh prefill's top two are a proven near-tie.
    print(f"cached vs fresh: argmax {int(np.argmax(cached))} vs {int(top2[1])}, fresh top-2 gap {gap:.3f}")
    assert int(np.argmax(cached)) == int(np.argmax(fresh)) or (gap < NEAR_TIE and int(np.argmax(cached)) in top2), gap
    assert diff.max() <= 1.5 * noise.max() + 0.05, (diff.max(), noise.max())
    assert diff.mean() <= 1.5 * noise.mean() + 0.01, (diff.mean(), noise.mean())


# A prompt whose greedy answer reaches a near-tie within a few tokens ("This class..." or "Inventory
# class..."): a one-row difference in how the prompt was read flips it (measured before the fix).
DOCSTRING_PROMPT = (
    "Add a docstring to every method of this class. Return the whole class with no other changes.\n\n"
    "```python\nclass Inventory:\n    def __init__(self):\n        self.items = {}\n\n"
    "    def add(self, name, qty):\n        if name in self.items:\n"
    "            self.items[name] = self.items[name] + qty\n        else:\n            self.items[name] = qty\n\n"
    "    def total(self):\n        t = 0\n        for name in self.items:\n            t = t + self.items[name]\n"
    "        return t\n```"
)


@pytest.mark.models
def test_a_prompt_read_fresh_or_from_reused_kv_gives_the_same_greedy_answer(engine):
    """Reusing a prompt's KV re-reads only its last token, alone; a fresh prefill reads that token
    alone too, so both compute the same numbers and give the same answer, with no near-tie allowed.
    (Read inside the last chunk, it flipped this answer's first word: repeated questions, the bench's
    repeats and a user's retry got different answers depending on what ran before.)"""
    req = chat(DOCSTRING_PROMPT, max_tokens=24, mode="off")
    engine.target.seq_rm(0, 0, -1)
    engine.slots[0].kv.clear()
    fresh, done_fresh, _ = run(engine, req)
    reused, done_reused, _ = run(engine, req)
    assert done_fresh.stats.reused_prefix_tokens == 0
    assert done_reused.stats.reused_prefix_tokens == done_reused.stats.prompt_tokens - 1
    assert reused == fresh, (engine.target.detokenize(fresh), engine.target.detokenize(reused))


@pytest.mark.models
def test_second_chat_turn_prefills_only_new_tokens(engine):
    msgs = [ChatMessage(role="system", content="You are terse."), ChatMessage(role="user", content="Say hello in French.")]
    ids1, done1, _ = run(engine, GenerationRequest(messages=msgs, max_tokens=16, mode="off"))
    turn2 = msgs + [ChatMessage(role="assistant", content=done1.text), ChatMessage(role="user", content="And in German?")]
    req2 = GenerationRequest(messages=turn2, max_tokens=8, mode="off")
    prompt2, _ = engine.prompt_tokens(req2)
    _, done2, _ = run(engine, req2)
    s = done2.stats
    assert s.reused_prefix_tokens >= done1.stats.prompt_tokens + len(ids1) - 2
    assert s.prompt_tokens - s.reused_prefix_tokens <= 20, s


@pytest.mark.models
def test_pinned_prefix_comes_back_after_other_work_in_the_slot(engine):
    """A pin_prefix request's shared messages are kept in their own sequence: after the slot served
    other work, the next such request gets them back by seq_cp, not by a prefill, and answers as a
    cold prefill does."""
    shared = [ChatMessage(role="system", content="Reply Yes or No."),
              ChatMessage(role="user", content="Is 7 a prime number?"), ChatMessage(role="assistant", content="Yes")]

    def ask(question: str, pin: bool = True) -> GenerationRequest:
        return GenerationRequest(messages=shared + [ChatMessage(role="user", content=question)], max_tokens=1,
                                 logprobs=5, mode="off", pin_prefix=pin)

    run(engine, ask("Is 9 a prime number?"))
    pinned = len(engine._pinned)
    assert pinned > 10 and engine.target.seq_pos_max(engine._pin_seq) == pinned - 1
    run(engine, chat("Write a haiku about rust.", max_tokens=8, mode="off"))  # slot 0 now holds other work
    assert common_prefix(engine.slots[0].kv, engine._pinned) < pinned
    _, warm, warm_tokens = run(engine, ask("Is 11 a prime number?"))
    assert warm.stats.reused_prefix_tokens == pinned
    engine._reset_kv(engine.slots[0])
    _, cold, cold_tokens = run(engine, ask("Is 11 a prime number?", pin=False))
    assert cold.stats.reused_prefix_tokens == 0
    assert warm_tokens[0].ids == cold_tokens[0].ids
    assert abs(warm_tokens[0].logprob.logprob - cold_tokens[0].logprob.logprob) < 0.05


@pytest.mark.models
def test_stop_string_split_across_tokens(engine):
    req = chat("Write a Python function that checks whether a number is prime.", max_tokens=64, mode="draft")
    _, full, _ = run(engine, req)
    assert "_prime(" in full.text
    _, done, _ = run(engine, req.model_copy(update={"stop": ["_prime("]}))
    assert done.finish_reason == "stop"
    assert "_prime(" not in done.text
    assert full.text.startswith(done.text) and len(done.text) < len(full.text)


@pytest.mark.models
def test_utf8_multibyte_characters_come_out_whole(engine):
    req = chat("Repeat exactly, nothing else: 你好，世界！🚀🎉 café", max_tokens=32, mode="lookup")
    ids, done, tokens = run(engine, req)
    assert "\ufffd" not in done.text
    assert "".join(t.text for t in tokens) == done.text
    assert any(ch in done.text for ch in "你好世界🚀🎉")
    # Some CJK/emoji token is a partial UTF-8 sequence on its own; check the stream held it back.
    pieces = [engine.target.piece(t) for t in ids]
    assert any(_incomplete(p) for p in pieces) or all(p.decode("utf-8", "strict") is not None for p in pieces)


def _incomplete(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


@pytest.mark.models
def test_cancel_from_another_thread_frees_the_slot(engine):
    handle = engine.submit(chat("Count from 1 to 200, one number per line.", max_tokens=400, mode="draft"))
    seen = 0
    while seen < 5:
        engine.step()
        while not handle.events.empty():
            if isinstance(handle.events.get(), Token):
                seen += 1
    t = threading.Thread(target=handle.cancel)
    t.start()
    t.join()
    for _ in range(3):
        engine.step()
        if handle.done.is_set():
            break
    assert handle.result is not None and handle.result.finish_reason == "cancelled"
    assert all(s.active is None for s in engine.slots)


@pytest.mark.models
def test_prompt_longer_than_context_is_refused_with_both_counts(engine):
    long = "word " * 3000
    with pytest.raises(ContextOverflowError) as exc:
        engine.submit(GenerationRequest(prompt=long, max_tokens=8))
    assert "2048" in str(exc.value) and str(exc.value.prompt_tokens) in str(exc.value)


@pytest.mark.models
def test_truncate_policy_drops_oldest_turns_but_keeps_system(engine):
    history = []
    for i in range(20):
        history += [ChatMessage(role="user", content=f"Question {i}: " + "lorem ipsum " * 60),
                    ChatMessage(role="assistant", content="ok")]
    msgs = [ChatMessage(role="system", content="SYSTEM-MARKER be brief")] + history + [
        ChatMessage(role="user", content="Reply with the word done.")]
    with pytest.raises(ContextOverflowError):
        engine.submit(GenerationRequest(messages=msgs, max_tokens=4))
    handle = engine.submit(GenerationRequest(messages=msgs, max_tokens=4, truncate=True, mode="off"))
    assert handle.dropped_messages > 0
    while not handle.done.is_set():
        engine.step()
    assert handle.result.finish_reason in ("stop", "length")
    tokens, dropped = engine.prompt_tokens(GenerationRequest(messages=msgs, max_tokens=4, truncate=True))
    text = engine.target.detokenize(tokens)
    assert "SYSTEM-MARKER" in text and "Reply with the word done." in text and "Question 0:" not in text


def test_request_validation():
    for bad in (dict(prompt="x", max_tokens=0), dict(prompt=""), dict(messages=[]), dict(prompt="x", messages=[])):
        with pytest.raises(ValidationError):
            GenerationRequest(**bad)
    with pytest.raises(ValidationError):
        SamplingParams(temperature=-0.1)


def test_missing_model_file_names_the_pull_command(tmp_path):
    with pytest.raises(LocalspecError) as exc:
        Engine.load(str(tmp_path / "nope.gguf"))
    assert "localspec models pull" in str(exc.value)


@pytest.mark.models
def test_embedding_model_refused_as_draft(target_path, minilm_path):
    with pytest.raises(IncompatibleDraftError) as exc:
        Engine.load(str(target_path), str(minilm_path), EngineConfig(n_ctx=256, n_threads=TEST_THREADS))
    assert "30522" in str(exc.value) and "151936" in str(exc.value)


REWRITTEN_MODULE = '''def load(path=PATH):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def save(todos, path=PATH):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(todos, f, indent=2)
    os.replace(tmp, path)
'''


def test_a_prediction_moved_into_a_class_is_followed_at_its_new_indentation(engine):
    """With the target's own tokenizer (its merges of runs of spaces and line ends): once a method's
    line is the function's line four spaces deeper, the cursor proposes the next lines four spaces
    deeper too, so the draft survives the line end."""
    tokens = engine.target.tokenize
    p = prepare(REWRITTEN_MODULE, engine.target, n_ctx=2048)
    out = ('class TodoStore:\n    def __init__(self, path=PATH):\n        self.path = path\n\n'
           '    def load(self):\n        with open(self.path, encoding="utf-8") as f:\n'
           '            return json.load(f)\n\n    def save(self, todos):\n        tmp = self.path + ".tmp"\n')
    ids = tokens(out, add_special=False, parse_special=False)
    for n in range(1, len(ids) + 1):  # as the engine folds in each step's token
        p.follow(ids[:n])
    assert p.aligned and [v.shift for v in p.views] == [0, 4]
    proposed = b"".join(engine.target.piece(t) for t in p.propose(32).tokens).decode()
    assert proposed.startswith('        with open(tmp, "w", encoding="utf-8") as f:\n            json.dump(todos, f')
