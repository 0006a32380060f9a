"""The false-hit guard: each trap category refuses, paraphrases pass. Pure text, no model."""

from __future__ import annotations

import pytest

from localspec.cache import cacheable, guard_compare, normalize_prompt
from localspec.cache.evaluate import Point, choose_threshold
from localspec.cache.guard import SOFT_SIMILARITY, conflict, conversions, numbers, qualifiers, technologies
from localspec.cache.normalize import content_words

TRAPS = {
    "numbers": [
        ("What is the sum of 3 and 4?", "What is the sum of 3 and 5?"),
        ("How do I round a number to 2 decimal places?", "How do I round a number to 3 decimal places?"),
        ("Undo the last two commits in git", "Undo the last three commits in git"),
        ("Is 7 greater than 5?", "Is 5 greater than 7?"),
        ("When did World War II end?", "When did World War I end?"),
        ("What is one plus one?", "What is one plus one plus one?"),
    ],
    "quoted": [
        ("Split a string by ',' in Python", "Split a string by ';' in Python"),
        ('Translate "good morning" into French', 'Translate "good night" into French'),
        ("How do I use the `git stash` command?", "How do I use the `git reset` command?"),
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
        ("How do I exit vim?", "How do I exit vim without saving?"),
    ],
    "entities": [
        ("What is the capital of France?", "What is the capital of Germany?"),
        ("Who painted the Mona Lisa?", "Who painted The Starry Night?"),
        ("How do I make an HTTP GET request with curl?", "How do I make an HTTP POST request with curl?"),
    ],
    "technology": [
        ("How do I reverse a list in Python?", "How do I reverse a list in JavaScript?"),
        ("How do I read a CSV file with pandas?", "How do I read a CSV file with polars?"),
        ("How do I find running containers in Docker?", "How do I find running pods in Kubernetes?"),
        ("How do I read a JSON file in Node.js?", "How do I read a JSON file in Deno?"),
        ("How do I install a package with pip?", "How do I install a package with npm?"),
        ("How do I put a PyTorch tensor on the GPU?", "How do I move a PyTorch tensor from the GPU to the CPU?"),
    ],
    "direction": [
        ("sort a list ascending", "sort a list descending"),
        ("How do I find the maximum of an array?", "How do I find the minimum of an array?"),
        ("Select the rows before 2020", "Select the rows after 2020"),
        ("How do I encode a string to base64?", "How do I decode a string from base64?"),
        ("Convert a string to lowercase", "Convert a string to uppercase"),
        ("How do I install a package with pip?", "How do I uninstall a package with pip?"),
        ("Is coffee good for your health?", "Is coffee bad for your health?"),
        ("How do I undo the last commit?", "How do I undo the first commit?"),
    ],
    "action": [
        ("How do I create a branch in git?", "How do I delete a branch in git?"),
        ("How do I find duplicate rows in SQL?", "What's the SQL to delete duplicate rows?"),
        ("How do I get the first character of a string?", "How do I remove the first character of a string?"),
        ("How can I improve my credit score?", "What lowers my credit score?"),
        ("When did the war start?", "When did the war end?"),
    ],
    "qualifier": [
        ("How do I reverse a list in Python?", "How do I reverse a linked list in Python?"),
        ("How do I copy a list in Python?", "How do I deep copy a list in Python?"),
        ("How do I list all files in a folder?", "How do I list all hidden files in a folder?"),
    ],
    "conversion": [
        ("How do I convert Celsius to Fahrenheit?", "How do I convert Fahrenheit to Celsius?"),
        ("Convert a list to a string in Python", "Convert a string to a list in Python"),
        ("How long is the flight from London to New York?", "How long is the flight from New York to London?"),
        ("Replace all spaces with underscores in a string", "Replace all underscores with spaces in a string"),
    ],
    "substitution": [
        ("How do I get the length of a string in Go?", "How do I get the length of an array in Go?"),
        ("How do I make a cup of green tea?", "How do I make a cup of black tea?"),
        ("How do I find duplicate rows in SQL?", "How do I delete duplicate rows in SQL?"),
        ("What is the time complexity of binary search?", "What is the space complexity of binary search?"),
    ],
}

# Reworded swaps: the frame changes too, so no single slot differs; only a high similarity serves them.
REWORDED_TRAPS = [
    ("Which chemical symbol stands for gold?", "What is the chemical symbol for silver?"),
    ("How much sleep does an adult need each night?", "How many hours of sleep do teenagers need?"),
    ("How do I reverse a string in Python?", "How do I reverse the words in a sentence in Python?"),
]

PARAPHRASES = [
    ("How do I reverse a list in Python?", "What's the way to reverse a Python list?"),
    ("What is the sum of 3 and 4?", "what is the sum of three and four"),
    ("How do I delete a file in Python?", "How do I remove a file in Python?"),
    ("How do I make a cup of green tea?", "How should I prepare a cup of green tea?"),
    ("Which city is the capital of France?", "What is the capital city of france?"),
    ("How do I convert a list to a string in Python?", "In Python, how can I turn a list into a string?"),
    # synonyms and idioms
    ("How do I create a virtual environment in Python?", "How can I set up a virtual environment for Python?"),
    ("How do I get rid of duplicates in a list?", "How do I remove duplicates from a list?"),
    ("What are the symptoms of dehydration?", "What are the signs of dehydration?"),
    ("What is the currency of Switzerland?", "What money do they use in Switzerland?"),
    ("How do I make a bash script executable?", "How do I make a shell script executable?"),
    ("How do I draw a line chart with matplotlib?", "matplotlib: how do I make a line plot?"),
    ("What is the sum of 3 and 4?", "Add 3 and 4"),
    ("What is 15 multiplied by 8?", "What's 15 times 8?"),
    ("How many calories are in a banana?", "What's the calorie count of a banana?"),
    ("How do I check the type of a variable in C++?", "In C++, how can I find out a variable's type?"),
    ("How do I kill a process by name?", "How do I stop a process by name?"),
    # word forms and reordering
    ("Who painted the Mona Lisa?", "Who is the painter of the Mona Lisa?"),
    ("Who wrote Pride and Prejudice?", "Who is the author of Pride and Prejudice?"),
    ("What language is spoken in Brazil?", "Which language do people speak in Brazil?"),
    ("How do I flatten a list of lists in Python?", "What's the way to flatten a nested list in Python?"),
    ("How do I read a file line by line in Java?", "In Java, how can I read a file one line at a time?"),
    # numbers and names written differently
    ("When did World War II end?", "In what year did the Second World War end?"),
    ("How do I catch multiple exceptions in one line?", "How can I catch more than one exception in a single line?"),
    ("What is the minimum wage in the UK?", "What's the UK's minimum wage?"),
    # qualifiers a library or a one-sided context implies
    ("How do I install a package with pip?", "What's the command to install a Python package using pip?"),
    ("How do I push my changes to the remote repository in git?", "How do I push local changes to the remote in git?"),
    ("How do I undo the last commit in git?", "What's the git command to undo the most recent commit?"),
    ("Is it safe to eat raw eggs?", "Can I safely eat raw eggs?"),
    ("How do I read a JSON file in Node.js?", "In Node, how can I load a JSON file?"),
]


@pytest.mark.parametrize(("category", "a", "b"), [(c, a, b) for c, pairs in TRAPS.items() for a, b in pairs])
def test_trap_is_refused(category: str, a: str, b: str) -> None:
    # hard rules: refused however similar the embeddings say the prompts are
    assert guard_compare(a, b, similarity=0.99) is not None, f"{category}: {a!r} would serve {b!r}"
    assert guard_compare(b, a, similarity=0.99) is not None, f"{category} (reversed): {b!r} would serve {a!r}"


@pytest.mark.parametrize(("a", "b"), PARAPHRASES)
def test_paraphrase_passes(a: str, b: str) -> None:
    # at a similarity typical of paraphrases; some reword a verb ("make"/"prepare"), a soft difference
    assert guard_compare(a, b, similarity=0.9) is None
    assert guard_compare(b, a, similarity=0.9) is None


@pytest.mark.parametrize(("a", "b"), REWORDED_TRAPS)
def test_reworded_swap_needs_a_high_similarity(a: str, b: str) -> None:
    assert guard_compare(a, b, similarity=0.84) == "reworded"
    assert guard_compare(b, a) == "reworded"  # no similarity: refused
    assert guard_compare(a, b, similarity=SOFT_SIMILARITY + 0.05) is None


def test_extra_name_on_one_side_is_soft_a_swapped_name_is_not() -> None:
    a, b = "How do I convert a timestamp to a date in JavaScript?", "How do I convert a Unix timestamp to a date in JavaScript?"
    assert guard_compare(a, b, similarity=0.80) == "extra entity"
    assert guard_compare(a, b, similarity=0.90) is None
    assert guard_compare("What is the capital of France?", "What is the capital of Germany?", similarity=0.99) == "entities"


def test_libraries_imply_their_language() -> None:
    assert technologies("install a package with pip") == {"pip", "python"}
    assert technologies("read a CSV with pd.read_csv in pandas") == {"pandas", "python", "csv"}
    assert technologies("How do I read a JSON file in Node.js?") == {"node", "javascript", "json"}


def test_qualifiers() -> None:
    assert qualifiers("reverse a doubly linked list in place") == {"doubly", "linked", "inplace"}
    assert qualifiers("sort the list") == frozenset()


def test_content_words_are_canonical() -> None:
    assert content_words("How do I get rid of the duplicates?") == content_words("How do I remove duplicates")
    assert content_words("Who is the author of Dune?") == content_words("Who wrote Dune?")
    assert content_words("list of dictionaries") == content_words("list of dicts")
    assert content_words("green tea") != content_words("black tea")


def test_number_words_become_digits() -> None:
    assert numbers("twenty five plus one hundred and five") == ("25", "105")
    assert numbers("which one is faster, a one-liner or a loop?") == ()
    assert numbers("the 2nd of 1,000 items, 3.5 each") == ("2", "1000", "3.5")
    assert numbers("catch several exceptions in one line") == ()  # a lone "one" is an article
    assert numbers("one plus one") == ("1", "1")
    assert numbers("World War II and Henry VIII") == ("2", "8")
    assert numbers("Can I do it?") == ()  # "I" is the pronoun

    # a dash between digits is no minus sign; a name's digits and a glued unit count; a word's do not
    assert numbers("numbers 1-5") == numbers("from one to five") == ("1", "5")
    assert numbers("a date like 2024-03-15") == ("2024", "3", "15")
    assert numbers("SHA256") == numbers("SHA-256") == ("256",)
    assert numbers("a 2kg chicken") == numbers("a 2 kg chicken") == ("2",)
    assert numbers("a 3x3 matrix") == numbers("a 3 by 3 matrix") == ("3", "3")
    assert numbers("list the k8s pods") == numbers("colour #a1b2c3") == ()
    assert numbers("upgrade to 1.2.3") != numbers("upgrade to 1.2.4")
    assert numbers("[1,2,3]") == ("1", "2", "3") and numbers("x = -3") == ("-3",)


def test_conversion_order() -> None:
    assert ("celsius", "fahrenheit") in conversions("convert from Celsius to Fahrenheit")
    assert ("integer", "string") in conversions("get a string from an int")
    assert ("tablespoon", "teaspoon") in conversions("How many teaspoons are in a tablespoon?")


def test_choose_threshold_keeps_a_margin() -> None:
    points = [Point(0.70, 0.91, 0.0, 1.0, 0.91, 0), Point(0.75, 0.90, 0.0, 1.0, 0.90, 0),
              Point(0.80, 0.895, 0.0, 1.0, 0.895, 0), Point(0.85, 0.80, 0.0, 1.0, 0.80, 0),
              Point(0.65, 0.95, 0.02, 0.9, 0.95, 0)]
    # 0.65 has more hits but too many false hits; 0.80 is the highest within 2 points of 0.70's 91%
    assert choose_threshold(points) == 0.80
    assert choose_threshold(points, slack=0.0) == 0.70


def test_normalize_prompt() -> None:
    assert normalize_prompt("  How do I   reverse a list?? ") == normalize_prompt("how do i reverse a list")
    assert normalize_prompt("Capital of France? Answer briefly.") == normalize_prompt("capital of france? answer briefly")
    assert normalize_prompt("sort ascending") != normalize_prompt("sort descending")
    # Case that is meaning, and a line's indentation, are kept
    assert normalize_prompt("Repeat: FOO") != normalize_prompt("Repeat: foo")
    assert normalize_prompt("rename x to X") != normalize_prompt("rename x to x")
    assert normalize_prompt("use getUser") != normalize_prompt("use getuser")
    assert normalize_prompt("if a:\n    b") != normalize_prompt("if a:\n  b")
    assert normalize_prompt("if a:\n    b  =  1") == normalize_prompt("if a:\n    b = 1  ")
    assert normalize_prompt("    x = 1\n    y = 2") != normalize_prompt("x = 1\n    y = 2")  # the first line's too
    assert normalize_prompt("  x = 1  ") == normalize_prompt("x = 1")  # one line: no layout
    assert normalize_prompt("X == x") != normalize_prompt("x == x")


@pytest.mark.parametrize(("a", "b", "why"), [
    ("Repeat this exactly: foo", "Repeat this exactly: FOO", "case"),
    ("Is x == X in Python?", "Is x == x in Python?", "case"),
    ("class Foo:\n    def bar(self):\n", "class Foo:\n  def bar(self):\n", "layout"),
    ("Which city is the capital of France?", "which city is the capital of france", None),
    ("How do I reverse a list? I need it fast.", "how do i reverse a list? i need it fast", None),
    ("X == x, is it true?", "x == x, is it true?", "case"),  # a sentence's first letter is a variable here
    ("A = [3, 1]; sort a", "a = [3, 1]; sort a", "case"),
    ("NASA was founded in which year?", "In which year was NASA founded?", None),  # was "case" (nASA)
    ("Explain SQL joins", "SQL joins explained", None),
])
def test_case_and_layout_that_change_the_answer_refuse_a_hit(a, b, why) -> None:
    assert guard_compare(a, b, similarity=0.99) == why
    assert conflict(a, b) == why


def test_cacheable_only_deterministic() -> None:
    assert cacheable({"temperature": 0.0})
    assert cacheable(None)  # localspec's defaults are greedy
    assert cacheable({"temperature": 0.8, "seed": 7})
    assert not cacheable({"temperature": 0.8})
    assert cacheable({"temperature": 0.8}, opt_in=True)


REVERSED_RELATIONS = [
    ("What is 90 divided by 3?", "What is 3 divided by 90?"),
    ("How do I move a file from my laptop to the server with scp?",
     "How do I move a file from the server to my laptop with scp?"),
    ("How do I convert a NumPy array into a tensor?", "How do I convert a tensor to a NumPy array?"),
    ("How many grams are in an ounce?", "How many ounces are in a gram?"),
    ("Is a cheetah faster than a lion?", "Is a lion faster than a cheetah?"),
]


@pytest.mark.parametrize(("a", "b"), REVERSED_RELATIONS)
def test_swapped_ends_of_one_relation_word_are_refused(a: str, b: str) -> None:
    # both guards: the judged path's facts-only guard too, since small judges read these as the same
    from localspec.cache.guard import conflict, reversed_relation

    assert reversed_relation(a, b) is not None and reversed_relation(b, a) is not None
    assert conflict(a, b) is not None and conflict(b, a) is not None
    assert guard_compare(a, b, similarity=0.99) is not None


@pytest.mark.parametrize(("a", "b"), [
    ("How do I turn a list into a string?", "How do I get a string from a list?"),  # another relation word
    ("How do I remove duplicates from a list in Python?", "Python: how do I get rid of duplicates in a list?"),
    ("Who is the author of 'War and Peace'?", "'War and Peace' was written by whom?"),  # quoted: one name
    ("How do I convert a list to a string in Python?", "In Python, how can I turn a list into a string?"),
])
def test_a_relation_reworded_is_not_reversed(a: str, b: str) -> None:
    from localspec.cache.guard import reversed_relation

    assert reversed_relation(a, b) is None and reversed_relation(b, a) is None
