"""Engine parts that need no model: text streaming, stop strings, prompt lookup, chat templates."""

from __future__ import annotations

import random
import numpy as np
import pytest

from localspec.engine.chat import ChatMessage, render_chat
from localspec.engine.drafters import PromptLookupDrafter
from localspec.engine.events import Stats
from localspec.engine.sampling import SamplingParams, distribution, penalize
from localspec.engine.text import StopMatcher, Utf8Stream
from localspec.errors import RequestError


def test_utf8_stream_holds_partial_characters():
    data = "a🚀你".encode()
    s = Utf8Stream()
    out = [s.feed(data[i : i + 1]) for i in range(len(data))]
    assert out[0] == "a" and out[1:4] == ["", "", ""] and out[4] == "🚀"
    assert "".join(out) + s.flush() == "a🚀你"


@pytest.mark.parametrize(
    "chunks,stops,text,matched",
    [
        (["Hel", "lo W", "orld"], ["lo W"], "Hel", "lo W"),
        (["ab", "c", "d"], ["cd"], "ab", "cd"),
        (["x", "<|e", "nd|>", "y"], ["<|end|>"], "x", "<|end|>"),
        (["one two"], ["zzz"], "one two", None),
        (["aa", "ab"], ["aab", "b"], "a", "aab"),
        (["go ab"], ["a", "ab"], "go ", "ab"),  # two starting at one place: the longer is the one that ended it
    ],
)
def test_stop_strings_across_chunks(chunks, stops, text, matched):
    """The answer's text up to the first stop string, and which one it was (Anthropic's stop_sequence)."""
    m = StopMatcher(stops)
    out, hit = [], False
    for c in chunks:
        t, hit = m.feed(c)
        out.append(t)
        if hit:
            break
    if not hit:
        out.append(m.flush())
    assert "".join(out) == text
    assert m.matched == matched


def test_stop_matcher_releases_a_false_start():
    m = StopMatcher(["END"])
    assert m.feed("foo EN") == ("foo ", False)
    assert m.feed("x") == ("ENx", False)


def test_prompt_lookup_proposes_the_continuation_of_the_latest_match():
    d = PromptLookupDrafter(n_min=2, n_max=3)
    hist = [1, 2, 3, 4, 5, 9, 9, 1, 2, 3]
    assert d.propose(hist, 2).tokens == (4, 5)
    assert d.propose([1, 2, 3, 7], 3).tokens == ()  # nothing matches: no draft
    assert d.match_length(hist) == 3
    # The most recent match wins.
    assert d.propose([5, 6, 1, 5, 6, 2, 5, 6], 1).tokens == (2,)


def test_prompt_lookup_names_a_match_in_the_answer_so_far_a_repeat():
    """auto books a copy of the prompt and an answer repeating itself apart (REPEAT_BUCKETS): `prompt`
    says where the answer starts; the proposal's source says which text it continues."""
    d = PromptLookupDrafter(n_min=2, n_max=3)
    prompt = [1, 2, 3, 4, 5]
    assert d.propose(prompt + [9, 1, 2], 2, prompt=len(prompt)).source == "lookup"  # continues the prompt
    answer = [7, 8, 6, 7, 8]
    assert d.propose(prompt + answer, 2, prompt=len(prompt)).source == "repeat"  # continues the answer's own text
    assert d.propose(prompt + answer, 2).source == "lookup"  # no prompt length given: every match a lookup


def test_prompt_lookup_finds_the_longest_latest_match_like_a_brute_force_search():
    def brute(hist, n_min, n_max, k):
        for n in range(min(n_max, len(hist) - 1), n_min - 1, -1):
            starts = [i for i in range(len(hist) - n) if hist[i : i + n] == hist[-n:]]
            if starts:
                return n, tuple(hist[starts[-1] + n : starts[-1] + n + k])
        return 0, ()

    rng = random.Random(7)
    d = PromptLookupDrafter(n_min=2, n_max=6)
    for _ in range(2000):
        hist = [rng.randrange(3) for _ in range(rng.randrange(1, 40))]
        got = d.propose(hist, 4)
        assert (got.match_length, got.tokens) == brute(hist, 2, 6, 4), hist


def test_sandboxed_chat_template_refuses_python_internals():
    hostile = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(RequestError) as exc:
        render_chat(hostile, [ChatMessage(role="user", content="hi")])
    assert "unsafe" in str(exc.value)


@pytest.mark.parametrize("broken", ["{{ x", "{% for m in messages %}{{ m.content }}", "{% endif %}"])
def test_a_chat_template_that_is_not_jinja_says_so_and_where(broken):
    """A syntax error in the template (a hand-written `chat_template` file, a bad GGUF) read "Check the
    messages' roles and order", a fix no message could make, and ended in two full stops."""
    with pytest.raises(RequestError) as exc:
        render_chat(broken, [ChatMessage(role="user", content="hi")])
    assert exc.value.cause.startswith("The chat template is not valid Jinja (line 1: ")
    assert not exc.value.cause.endswith("..") and "roles" not in exc.value.fix and "without --chat" in exc.value.fix


def test_chatml_fallback_renders_generation_prompt():
    text = render_chat(None, [ChatMessage(role="user", content="hi")])
    assert text.endswith("<|im_start|>assistant\n") and "<|im_start|>user\nhi<|im_end|>" in text


def test_distribution_filters_and_pads():
    logits = np.array([3.0, 2.0, 1.0, 0.0], dtype=np.float32)
    p = distribution(logits, SamplingParams(temperature=1.0, top_k=2), [], n_vocab=6)
    assert p.shape == (6,) and p[2:].sum() == 0 and abs(p.sum() - 1) < 1e-12
    p = distribution(logits, SamplingParams(temperature=1.0, top_p=0.5), [])
    assert p[0] == 1.0
    p = distribution(logits, SamplingParams(temperature=0.0), [])
    assert p.tolist() == [1.0, 0.0, 0.0, 0.0]


def test_penalties_use_the_history():
    logits = np.array([2.0, 2.0, -1.0], dtype=np.float32)
    out = penalize(logits, SamplingParams(repeat_penalty=2.0, presence_penalty=0.5), [0, 2, 2])
    assert out.tolist() == [0.5, 2.0, -2.5]


def test_a_tiny_repeat_penalty_keeps_the_distribution_finite():
    """repeat_penalty 1e-300 (valid: > 0) divided a logit to inf, and the distribution came out NaN."""
    logits = np.array([2.0, 3.0, -1.0, 0.5], dtype=np.float32)
    params = SamplingParams(repeat_penalty=1e-300, temperature=1.0)
    p = distribution(logits, params, [0, 1, 2])
    assert np.isfinite(p).all() and abs(p.sum() - 1) < 1e-9 and p[3] < 1e-6  # the repeated ones win
    assert np.isfinite(penalize(logits, params, [0, 1, 2])).all()


def test_a_tiny_temperature_is_the_argmax_not_nan():
    """temperature 1e-308 (valid: >= 0) divided the logits past float64's range: inf - inf was a NaN
    distribution, and the draw then took the last token of the vocabulary. So did a tiny repeat_penalty
    under temperature 1e-300 (its float32-largest logit divided again)."""
    logits = np.array([30.0, 20.0, 29.5, -1.0], dtype=np.float32)
    for params, history in ((SamplingParams(temperature=1e-308), []),
                            (SamplingParams(temperature=1e-300, repeat_penalty=1e-300), [1])):
        p = distribution(logits, params, history)
        assert np.isfinite(p).all() and abs(p.sum() - 1) < 1e-9, (params, p)
        assert int(np.argmax(p)) == int(np.argmax(penalize(logits, params, history))) and p.max() == 1.0
    normal = SamplingParams(temperature=0.7, top_k=3)  # an ordinary temperature: the very same floats
    z = logits.astype(np.float64) / 0.7
    z[3] = -np.inf
    expected = np.exp(z - z.max())
    assert distribution(logits, normal, []).tolist() == (expected / expected.sum()).tolist()


def test_stats_positions_and_mean_accepted_length():
    s = Stats(completion_tokens=9, target_passes=2)
    s.record_position(4, 4)
    s.record_position(4, 1)
    assert s.drafted_by_position == [2, 2, 2, 2] and s.accepted_by_position == [2, 1, 1, 1]
    assert s.mean_accepted_length == 4.0


def test_the_target_context_serves_the_longest_draft_in_one_pass():
    from localspec.engine.config import MAX_DRAFT_K, EngineConfig, output_rows

    assert output_rows(EngineConfig()) == MAX_DRAFT_K + 1  # one sequence at the longest k
    assert output_rows(EngineConfig(parallel=8)) == 8 * (16 + 1)  # every slot at its configured k (auto's 16)
    assert output_rows(EngineConfig(n_batch=32)) == 32  # never more than a batch holds (the runtime splits)
