"""The false-hit guard: each trap category refuses, paraphrases pass. Pure text, no model."""

from __future__ import annotations

import pytest

from localspec.cache import cacheable, guard_compare, normalize_prompt
from localspec.cache.guard import conversions, numbers

TRAPS = {
    "numbers": [
        ("What is the sum of 3 and 4?", "What is the sum of 3 and 5?"),
        ("How do I round a number to 2 decimal places?", "How do I round a number to 3 decimal places?"),
        ("Undo the last two commits in git", "Undo the last three commits in git"),
        ("Is 7 greater than 5?", "Is 5 greater than 7?"),
    ],
    "quoted": [
        ("Split a string by ',' in Python", "Split a string by ';' in Python"),
        ('Translate "good morning" into French', 'Translate "good night" into French'),
    ],
    "identifiers": [
        ("How do I use getElementById?", "How do I use querySelector?"),
        ("What does os.path.join do?", "What does os.path.split do?"),
        ("Explain the --force flag of git push", "Explain the --dry-run flag of git push"),
    ],
    "negation": [
        ("How do I remove duplicates from a list?", "How do I remove duplicates from a list without using a set?"),
        ("Is this function pure?", "Is this function not pure?"),
        ("Undo the last commit in git", "Undo the last commit in git but don't lose my changes"),
    ],
    "entities": [
        ("What is the capital of France?", "What is the capital of Germany?"),
        ("Who painted the Mona Lisa?", "Who painted The Starry Night?"),
    ],
    "technology": [
        ("How do I reverse a list in Python?", "How do I reverse a list in JavaScript?"),
        ("How do I read a CSV file with pandas?", "How do I read a CSV file with polars?"),
        ("How do I find running containers in Docker?", "How do I find running pods in Kubernetes?"),
    ],
    "direction": [
        ("sort a list ascending", "sort a list descending"),
        ("How do I find the maximum of an array?", "How do I find the minimum of an array?"),
        ("Select the rows before 2020", "Select the rows after 2020"),
        ("How do I encode a string to base64?", "How do I decode a string from base64?"),
        ("Convert a string to lowercase", "Convert a string to uppercase"),
        ("How do I install a package with pip?", "How do I uninstall a package with pip?"),
        ("Is coffee good for your health?", "Is coffee bad for your health?"),
    ],
    "conversion": [
        ("How do I convert Celsius to Fahrenheit?", "How do I convert Fahrenheit to Celsius?"),
        ("Convert a list to a string in Python", "Convert a string to a list in Python"),
        ("How long is the flight from London to New York?", "How long is the flight from New York to London?"),
    ],
    "substitution": [
        ("How do I get the length of a string in Go?", "How do I get the length of an array in Go?"),
        ("How do I make a cup of green tea?", "How do I make a cup of black tea?"),
        ("How do I find duplicate rows in SQL?", "How do I delete duplicate rows in SQL?"),
    ],
}

PARAPHRASES = [
    ("How do I reverse a list in Python?", "What's the way to reverse a Python list?"),
    ("What is the sum of 3 and 4?", "what is the sum of three and four"),
    ("How do I delete a file in Python?", "How do I remove a file in Python?"),
    ("How do I make a cup of green tea?", "How should I prepare a cup of green tea?"),
    ("Which city is the capital of France?", "What is the capital city of france?"),
    ("How do I convert a list to a string in Python?", "In Python, how can I turn a list into a string?"),
]


@pytest.mark.parametrize(("category", "a", "b"), [(c, a, b) for c, pairs in TRAPS.items() for a, b in pairs])
def test_trap_is_refused(category: str, a: str, b: str) -> None:
    assert guard_compare(a, b) is not None, f"{category}: {a!r} would serve {b!r}"
    assert guard_compare(b, a) is not None, f"{category} (reversed): {b!r} would serve {a!r}"


@pytest.mark.parametrize(("a", "b"), PARAPHRASES)
def test_paraphrase_passes(a: str, b: str) -> None:
    assert guard_compare(a, b) is None
    assert guard_compare(b, a) is None


def test_number_words_become_digits() -> None:
    assert numbers("twenty five plus one hundred and five") == ("25", "105")
    assert numbers("which one is faster, a one-liner or a loop?") == ()
    assert numbers("the 2nd of 1,000 items, 3.5 each") == ("2", "1000", "3.5")


def test_conversion_order() -> None:
    assert ("celsius", "fahrenheit") in conversions("convert from Celsius to Fahrenheit")
    assert ("int", "string") in conversions("get a string from an int")


def test_normalize_prompt() -> None:
    assert normalize_prompt("  How do I   reverse a list?? ") == normalize_prompt("how do i reverse a list")
    assert normalize_prompt("sort ascending") != normalize_prompt("sort descending")


def test_cacheable_only_deterministic() -> None:
    assert cacheable({"temperature": 0.0})
    assert cacheable(None)  # localspec's defaults are greedy
    assert cacheable({"temperature": 0.8, "seed": 7})
    assert not cacheable({"temperature": 0.8})
    assert cacheable({"temperature": 0.8}, opt_in=True)
