"""The scripted model the control-flow tests stand on (tests/fake_tier.py): it must say its script
through the real engine in every mode, and catch the KV mistakes llama.cpp would not."""

from __future__ import annotations

import pytest

from localspec.engine.config import GenerationRequest
from localspec.engine.events import Done
from localspec.engine.runtime import Row
from tests.fake_tier import EOS, SEP, Reply, ScriptedRuntime, scripted, scripted_engine

SCRIPT = scripted({"France": "Paris, of course. Ünïcode too: ✓"}, default="I do not know.")


def _done(engine, request: GenerationRequest) -> Done:
    return [e for e in engine.generate(request) if isinstance(e, Done)][-1]


@pytest.mark.parametrize("mode", ["off", "draft", "lookup", "auto"])
def test_the_engine_says_the_script_in_every_mode(mode):
    engine = scripted_engine(script=SCRIPT, draft_script=SCRIPT, mode=mode)
    chat = GenerationRequest(messages=[{"role": "user", "content": "The capital of France?"}], max_tokens=64)
    for request in (chat, chat, GenerationRequest(prompt="Who are you?", max_tokens=64)):  # twice: prefix reuse
        done = _done(engine, request)
        assert done.finish_reason == "stop", done
        assert done.text == ("Paris, of course. Ünïcode too: ✓" if request.messages else "I do not know.")
    if mode == "draft":
        assert done.stats.drafted > 0 and done.stats.accepted == done.stats.drafted  # the draft has the same script
    capped = _done(engine, GenerationRequest(prompt="Who are you?", max_tokens=4))
    assert (capped.finish_reason, capped.text) == ("length", "I do")


def test_an_unsure_reply_has_low_logprobs_and_a_failing_one_fails_the_request():
    engine = scripted_engine(script=scripted({"unsure": Reply("maybe", confidence=1.0),
                                              "broken": Reply("x", fail="scripted fault")}))
    tokens = [e for e in engine.generate(GenerationRequest(prompt="unsure", max_tokens=8, logprobs=1))
              if not isinstance(e, Done)]
    assert "".join(t.text for t in tokens) == "maybe" and all(t.logprob.logprob < -4 for t in tokens)
    failed = _done(engine, GenerationRequest(prompt="broken", max_tokens=8))
    assert failed.finish_reason == "error" and "scripted fault" in failed.error
    assert _done(engine, GenerationRequest(prompt="fine", max_tokens=32)).text == "OK."


def test_the_scripted_runtime_catches_kv_mistakes():
    rt = ScriptedRuntime(SCRIPT, n_seq_max=2)
    prompt = rt.tokenize("France")
    assert prompt[-1] == SEP and rt.is_eog(EOS)
    rt.decode([Row(t, i, 0, logits=i == len(prompt) - 1) for i, t in enumerate(prompt)])
    with pytest.raises(AssertionError, match="already in the KV cache"):
        rt.decode([Row(1, 0, 0)])
    with pytest.raises(AssertionError, match="decoding position"):
        rt.decode([Row(1, 3, 1)])  # positions 0..2 of sequence 1 were never written
    rt.seq_rm(0, 2)
    rt.decode([Row(prompt[2], 2, 0)])  # after a rollback the position is free again
