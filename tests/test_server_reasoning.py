"""A thinking model's thought apart from its answer: the whole split, the streamed splitter over any
chunking, and the prompt probe that says whether the generation prompt opened the thought."""

from __future__ import annotations

import pytest

from localspec.engine.config import EngineConfig
from localspec.engine.scheduler import Engine
from localspec.engine.thoughts import ThoughtSplit, split_reasoning
from tests.fake_tier import ScriptedRuntime, scripted

THOUGHTS = [  # (answer, opened, (thought, content))
    ("<think>\nLet me see. 2+2=4.\n</think>\n\nIt is 4.", False, ("Let me see. 2+2=4.", "It is 4.")),
    ("\n<think>x</think>y", False, ("x", "y")),  # whitespace before the thought
    ("<think>\n\n</think>\n\nHi.", False, ("", "Hi.")),  # an empty thought (Qwen3 told not to think)
    ("<think>\nStill thinking about", False, ("Still thinking about", "")),  # cut off inside it
    ("<think>a </thi", False, ("a </thi", "")),  # cut off inside the closing marker
    ("Okay, 2+2.\n</think>\n\n4.", True, ("Okay, 2+2.", "4.")),  # the prompt opened it
    ("\nHmm, a <think> inside </think> Out <think>", True, ("Hmm, a <think> inside", "Out <think>")),
    ("Hmm, cut off", True, ("Hmm, cut off", "")),
    ("</think>Only content.", True, ("", "Only content.")),
]
PLAIN = ["Paris.", "  Paris.\n", "<thinking> is a tag", "<th", "", "A </think> is text here", "<", " <t"]


@pytest.mark.parametrize(("answer", "opened", "split"), THOUGHTS)
def test_a_thought_is_split_from_the_content(answer, opened, split):
    assert split_reasoning(answer, opened=opened) == split


@pytest.mark.parametrize("answer", PLAIN)
def test_an_answer_without_a_thought_is_unchanged(answer):
    assert split_reasoning(answer, opened=False) == (None, answer)


def _fed(answer: str, size: int, opened: bool) -> list[tuple[str, str, int]]:
    """(thought, content) a ThoughtSplit has sent after each of `answer`'s chunks of `size`, in all,
    and what it holds."""
    split, thought, content, out = ThoughtSplit(opened=opened), "", "", []
    for i in range(0, len(answer), size):
        t, c = split.feed(answer[i:i + size])
        thought, content = thought + t, content + c
        out.append((thought, content, split.held))
    return out


CASES = [(a, o) for a, o, _ in THOUGHTS] + [(a, False) for a in PLAIN] + [(a, True) for a in PLAIN]


@pytest.mark.parametrize(("answer", "opened"), CASES)
def test_what_a_thought_split_sends_is_always_the_start_of_the_whole_split(answer, opened):
    whole_thought, whole_content = split_reasoning(answer, opened=opened)
    for size in (1, 2, 3, 7, max(len(answer), 1)):
        for thought, content, _ in _fed(answer, size, opened):
            assert (whole_thought or "").startswith(thought), (size, thought)
            assert whole_content.startswith(content), (size, content)
            assert not content or whole_content == "" or thought == (whole_thought or "")  # thought first


@pytest.mark.parametrize(("answer", "opened", "before_the_end"), [
    ("<think>\nA thought.\n</think>\n\nThe answer.", False, ("A thought.", "The answer.")),
    ("<think> A thought, then ", False, ("A thought, then", "")),  # its trailing whitespace waits
    ("<think>A thought </thi", False, ("A thought", "")),  # a possible </think> waits
    ("Plain text.", False, ("", "Plain text.")),  # no thought: all of it, as it comes
    ("  <thi", False, ("", "")),  # it may yet open a thought: held
    ("Opened. </think>\n\n", True, ("Opened.", "")),  # the content's leading whitespace waits
])
def test_what_a_thought_split_sends_before_the_end(answer, opened, before_the_end):
    thought, content, _ = _fed(answer, 1, opened)[-1]
    assert (thought, content) == before_the_end


def test_what_it_holds_is_counted():
    split = ThoughtSplit(opened=False)
    assert split.feed("<think>ab </th") == ("ab", "")
    assert split.held == len(" </th")
    assert split.feed("ink>\n") == ("", "")
    assert split.held == 0  # the marker and the whitespace after it are gone, not held


OPENING = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}<|assistant|><think>\n"
THINKING_OFF = OPENING.replace("<think>\n", "<think>\n\n</think>\n\n")


@pytest.mark.parametrize(("template", "opened"), [
    (None, False),  # ChatML, as a Qwen2.5 model's
    (OPENING, True),  # DeepSeek-R1-Distill's generation prompt opens the thought
    (THINKING_OFF, False),  # Qwen3's with thinking off: an empty thought, closed
    ("{{ raise_exception('no') }}", False),  # a refused template opens none (its requests fail on their own)
])
def test_the_prompter_says_whether_the_generation_prompt_opens_a_thought(template, opened):
    engine = Engine(ScriptedRuntime(scripted()), config=EngineConfig(n_ctx=1024, mode="off", pinned_prefix_cells=0),
                    chat_template=template)
    try:
        assert engine.prompter.opens_thought is opened
    finally:
        engine.close()
