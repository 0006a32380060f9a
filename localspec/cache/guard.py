"""The false-hit guard: facts two prompts must agree on before one's answer serves the other.

Embeddings score "sort ascending" and "sort descending" as near-duplicates, and "sum of 3 and 4"
against "sum of 3 and 5" even higher. Similarity alone cannot tell them apart, so a semantic hit
is served only when the prompts also agree on every detail that changes the answer. Before any
rule runs, abbreviations are written out ("WWII" -> World War 2, "US" -> United States) and
Roman numerals become digits, so the same fact written two ways still agrees.

Hard rules refuse however similar the prompts are:

- numbers (digits, number words, ordinals), in order; a lone "one" counts as the article it
  usually is ("in one line" = "in a single line"), so only real counts must match;
- quoted strings and code identifiers, case-sensitively (dotted tool names like Node.js are
  technologies, not identifiers);
- negation (not, without, except, avoid, ...; Python's "except clause" is not a negation);
- languages, libraries and tools, through a lexicon of aliases (js = javascript, sh = bash) and
  implications (pip and pandas imply Python, npm implies JavaScript), so "install a package with
  pip" and "install a Python package with pip" agree while pip/npm do not;
- swapped names: each prompt has a capitalised name or acronym the other lacks (France/Germany,
  GET/POST);
- direction words (ascending/descending, min/max, first/last, before/after, upper/lower...): in
  most groups a pole named on one side only is a difference; in context groups (rows/columns,
  local/remote, good/bad, client/server) only two opposite poles conflict, since "order the rows"
  and "order the results" ask the same;
- actions: opposite verbs (add/remove, create/delete, find/delete, install/uninstall, start/end,
  increase/decrease), and an object-changing verb on one side only ("remove the first character"
  vs "get the first character");
- qualifiers that make the noun another thing (linked list, deep copy, hidden files, in place,
  recursive, binary/linear, unique...) must match;
- ordered relations: "X to Y" never serves "Y to X", nor "replace X with Y" "replace Y with X";
  nor, more generally, two content words joined by one relation word (to/into, from, of, in, by,
  than, per) with their places swapped: "144 divided by 12" / "12 divided by 144";
- a one-slot substitution: the prompts align word for word except one run of one or two content
  words ("length of a string" / "length of an array", "green tea" / "black tea").

Soft rules refuse only below SOFT_SIMILARITY (or when no similarity is given):

- a name on one side only ("a Unix timestamp" / "a timestamp"): often a harmless qualifier,
  sometimes a narrower question;
- reworded content: each prompt has content words the other lacks, after canonical word forms
  and synonyms (normalize.words). Paraphrases reword freely, and so do traps that swap a word
  while rewording the frame ("Which symbol stands for gold?" / "What is the symbol for silver?");
  the embeddings separate those two only at high similarity.

All word comparisons use canonical forms (stems, irregular forms, synonyms, idioms such as "get rid
of" = remove), so a paraphrase's other wording is not mistaken for a difference. Words never made
synonyms are those whose difference changes the answer (remove/hide, sum/mean).

`compare` returns the first disagreement, or None when the prompts agree. It is deliberately
strict: a rejected paraphrase costs one generation, a served trap is a wrong answer. The word
tables the rules read are in localspec.cache.guard_lexicon."""

from __future__ import annotations

import difflib
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache

from localspec.cache.guard_lexicon import (
    ABBREVIATIONS, ACTIONS, BRANDS, CHANGING_ACTIONS, CONVERT, CONVERT_FILLER, DIRECTIONS, IMPLIES, NEGATION,
    NOT_ENTITIES, OPPOSITE_ACTIONS, PAIRED_ONLY, QUALIFIERS, RELATION_WORDS, SCALES, TECH_ALIASES, TECH_CAPITAL_ONLY,
    TENS, UNIT_WORDS, UNITS
)
from localspec.cache.normalize import FUNCTION_WORDS, canonical, raw_words, respelled, words
from localspec.cache.numbers import numbers, roman_as_digits

# ---------------------------------------------------------------- quoted strings, identifiers

_QUOTED = re.compile(r'"([^"\n]+)"|“([^”\n]+)”|`([^`\n]+)`|‘([^’\n]+)’|(?<![\w])\'([^\'\n]+)\'(?![\w])')
_DOTTED = re.compile(r"(?<![\w.])[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+(?:\(\))?")
_FLAG = re.compile(r"(?<![\w-])--?[A-Za-z][\w-]*")
_FILE_EXT = re.compile(r"(?<![\w])\.[a-z0-9]{1,5}\b")


def quoted(text: str) -> frozenset[str]:
    return frozenset(next(g for g in m.groups() if g is not None).strip() for m in _QUOTED.finditer(text))


def _is_code_word(w: str) -> bool:
    core = w[:-2] if w.endswith("()") else w
    if w.endswith("()"):
        return True
    if "_" in core.strip("_") or core.startswith("__"):
        return True
    # camelCase / PascalCase with an inner capital: getElementById, ArrayList (not "iPhone"-like words)
    return bool(re.search(r"[a-z][A-Z]", core)) and not core.isupper()


def identifiers(text: str) -> frozenset[str]:
    """snake_case, camelCase, calls, dotted names, command-line flags and file extensions."""
    found: set[str] = set()
    for m in _DOTTED.finditer(text):
        name = m.group(0).rstrip(".")
        if name.lower() in TECH_ALIASES or name.lower().endswith(".js"):
            continue  # Node.js, Vue.js: technologies, compared as such
        if not re.fullmatch(r"[A-Z][a-z]+\.[A-Z][a-z]+", name):  # "Hello.World" sentence break
            found.add(name.removesuffix("()"))
    for m in re.finditer(r"[A-Za-z_][\w]*(?:\(\))?", text):
        w = m.group(0)
        if w.lower() in TECH_ALIASES or w.lower() in BRANDS:
            continue  # JavaScript, DataFrame: names, compared case-insensitively elsewhere
        if _is_code_word(w):
            found.add(w.removesuffix("()"))
    found.update(f for m in _FLAG.finditer(text) if not re.fullmatch(r"-\w+", f := m.group(0)) or len(f) <= 3)
    found.update(m.group(0) for m in _FILE_EXT.finditer(text))
    # A dotted name also contributes its parts; keep only the full names.
    return frozenset(found)


# ---------------------------------------------------------------- negation

def negated(text: str) -> bool:
    return bool(NEGATION.search(text.replace("’", "'")))


# ---------------------------------------------------------------- directions


def qualifiers(text: str) -> frozenset[str]:
    t = re.sub(r"\bin[- ]place\b", "inplace", text, flags=re.IGNORECASE)
    t = re.sub(r"\bcase[- ](in)?sensitive(ly)?\b", r"case \1sensitive", t, flags=re.IGNORECASE)
    return frozenset(QUALIFIERS[c] for c in (canonical(w) for w in raw_words(t)) if c in QUALIFIERS)


@lru_cache(maxsize=None)
def _pole_re(pattern: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w-])(?:{pattern})(?![\w-])", re.IGNORECASE)


def directions(text: str) -> frozenset[tuple[str, str]]:
    """(group, pole) pairs the prompt mentions, e.g. ("order", "down")."""
    found: set[tuple[str, str]] = set()
    for group, poles in DIRECTIONS.items():
        for pole, pattern in poles.items():
            if _pole_re(pattern).search(text):
                found.add((group, pole))
    return frozenset(found)


def actions(text: str) -> frozenset[str]:
    """Canonical actions named by the prompt's verbs, idioms included ("get rid of" -> remove)."""
    return frozenset(ACTIONS[w] for w in raw_words(text) if w in ACTIONS)


# ---------------------------------------------------------------- languages, libraries, tools


def technologies(text: str) -> frozenset[str]:
    """Languages, libraries and tools the prompt names, canonical, with the languages they imply."""
    found = _named_technologies(text)
    return frozenset(found | {IMPLIES[t] for t in found if t in IMPLIES})


def _named_technologies(text: str) -> set[str]:
    found: set[str] = set()
    for m in re.finditer(r"[A-Za-z][A-Za-z0-9+#.\-]*[A-Za-z0-9+#]|[A-Za-z]", text):
        w = m.group(0)
        if w in TECH_CAPITAL_ONLY:
            found.add(TECH_CAPITAL_ONLY[w])
            continue
        low = w.lower()
        if low in ("rust", "ruby", "julia", "dart", "flask", "node") and w[0].islower():
            continue  # plain English words unless capitalised
        if low in TECH_ALIASES:
            found.add(TECH_ALIASES[low])
        elif "." in low and low.split(".")[0] in TECH_ALIASES and low not in TECH_ALIASES:
            found.add(TECH_ALIASES[low.split(".")[0]])  # np.sort -> numpy
    return found


# ---------------------------------------------------------------- named entities


def expand_abbreviations(text: str) -> str:
    """Abbreviations written out, Roman numerals as digits ("WWII" -> "World War 2")."""
    for rx, full in ABBREVIATIONS:
        text = rx.sub(full, text)
    return roman_as_digits(text)


def entities(text: str) -> frozenset[str]:
    """Capitalised words and acronyms that are not sentence starters or technologies, folded."""
    found: set[str] = set()
    for m in re.finditer(r"[A-Za-z][A-Za-z0-9'\-]*", text):
        w = m.group(0)
        if not (w[0].isupper() or (len(w) > 1 and w.isupper())):
            continue
        low = w.lower().removesuffix("'s")
        initial = m.start() == 0 or text[:m.start()].rstrip()[-1:] in (".", "?", "!", ":", "-")
        if initial and not w.isupper() and re.search(r"(?:ing|ed|ly)$", low):
            continue  # "Reading a CSV file...": a verb that starts the sentence
        acronym = w.isupper() and len(w) > 1 and low not in ("ok", "is", "it", "am", "an")  # GET/POST, not "IS"
        if (low in NOT_ENTITIES and not acronym) or len(low) < 2 or w in TECH_CAPITAL_ONLY or low in TECH_ALIASES:
            continue
        found.add(low)
    return frozenset(found)


# ---------------------------------------------------------------- conversion direction


def _canon_word(w: str) -> str:
    """A conversion's end in canonical form: js = javascript, kilometres = km, dicts = dictionary."""
    low = w.lower().strip(".")
    if low in TECH_ALIASES:
        return TECH_ALIASES[low]
    low = UNIT_WORDS.get(low, low)
    return canonical(UNIT_WORDS.get(low.removesuffix("s"), low))


_NAME_RUN = re.compile(r"\b[A-Z][a-z]+(?:\s+[A-Z][a-z]+)+\b")


def conversions(text: str) -> frozenset[tuple[str, str]]:
    """Ordered (source, target) pairs: "Celsius to Fahrenheit", "string from an int" = (int, string)."""
    pairs: set[tuple[str, str]] = set()
    text = _NAME_RUN.sub(lambda m: m.group(0).replace(" ", "_"), text)  # "New York" is one place
    for i, rx in enumerate(CONVERT):
        for m in rx.finditer(text):
            a, b = _canon_word(m.group(1)), _canon_word(m.group(2))
            if i in (2, 3):  # "X from Y", "how many X in Y": Y is the source
                a, b = b, a
            if a != b and a not in CONVERT_FILLER and b not in CONVERT_FILLER and not a.isdigit():
                pairs.add((a, b))
    return frozenset(pairs)


# Ends further apart than this many other content words are not read as one relation: "remove
# duplicates from a list in Python" / "Python: get rid of duplicates in a list" keep their meaning.
_RELATION_SPAN = 1


def relations(text: str) -> frozenset[tuple[str, str, str]]:
    """(relation word, left end, right end) for content words joined by one relation word group.

    Ends are canonical words that occur once in the prompt (a repeated canonical form is told
    apart by its raw word: "String" / "&str"); quoted text is skipped, being one name, not words.
    """
    tokens = _tokens(_QUOTED.sub(" ", text))
    counts = Counter(c for _, c in tokens)
    keyed = [(raw, c if counts[c] == 1 else raw, _is_content(raw, c)) for raw, c in tokens]
    key_counts = Counter(k for _, k, _ in keyed)
    found: set[tuple[str, str, str]] = set()
    for i, (_, left, is_content) in enumerate(keyed):
        if not is_content or key_counts[left] != 1:
            continue
        between = 0
        for j in range(i + 1, len(keyed)):
            _, right, right_content = keyed[j]
            if not right_content:
                continue
            if between > _RELATION_SPAN:
                break
            between += 1
            if key_counts[right] != 1 or right == left:
                continue
            joined = {RELATION_WORDS[r] for r, _, _ in keyed[i + 1:j] if r in RELATION_WORDS}
            if len(joined) == 1:
                found.add((joined.pop(), left, right))
    return frozenset(found)


def reversed_relation(a: str, b: str) -> tuple[str, str, str] | None:
    """A relation of `a` whose ends `b` joins by the same word the other way round, or None."""
    rb = relations(b)
    return next((r for r in sorted(relations(a)) if (r[0], r[2], r[1]) in rb), None)


# ---------------------------------------------------------------- content words


def _tokens(text: str) -> list[tuple[str, str]]:
    """(raw, canonical) words: number words as digits, technologies by their canonical name."""
    out = []
    for raw, canon in words(expand_abbreviations(text)):
        if raw in UNITS:
            canon = str(UNITS[raw])
        elif raw in TENS or raw in SCALES:  # "last hundred lines" = "last 100 lines"
            canon = str(TENS.get(raw) or SCALES[raw])
        elif raw in TECH_ALIASES:
            canon = TECH_ALIASES[raw]
        out.append((raw, canon))
    return out


def _is_content(raw: str, canon: str) -> bool:
    return raw not in FUNCTION_WORDS and canon not in FUNCTION_WORDS


# ---------------------------------------------------------------- one-slot substitutions

# A trap usually keeps the question's frame and swaps one content word ("length of a string" ->
# "length of an array", "green tea" -> "black tea"); a paraphrase rewords the frame. So when the two
# prompts' words align one to one except for one replaced run of content words, they ask different
# things. Words are compared in canonical form (normalize.words), so "delete"/"remove" agree.


def _verb_slot(tokens: list[tuple[str, str]], i: int) -> bool:
    """Where a question puts its main verb: first word, or after "I", "to", "Python:"."""
    if i == 0:
        return True
    prev = tokens[i - 1][0]
    return prev in ("i", "you", "we", "to", "please") or prev in TECH_ALIASES


def substitution(a: str, b: str) -> tuple[str, str] | None:
    """The (a-words, b-words) of a one-slot swap in an otherwise identical prompt, or None.

    Only a minimal edit counts: everything but one run of at most two content words must be the
    same, in order. Not a swap: function words only ("a" -> "an"); a word that also occurs elsewhere
    in the other prompt (a reordering: "list of lists" / "nested list"); the leading verb ("make" /
    "prepare"), unless both verbs are known actions of different kinds ("find"/"delete" rows); two
    verbs of one action ("kill"/"stop"). Below SOFT_SIMILARITY the `reworded` rule refuses all of
    these anyway; this rule is what refuses a one-word swap at any similarity.
    """
    ta, tb = _tokens(a), _tokens(b)
    ca, cb = [c for _, c in ta], [c for _, c in tb]
    swaps = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=ca, b=cb, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        left = [(i, *ta[i]) for i in range(i1, i2) if _is_content(*ta[i]) and ta[i][1] not in cb]
        right = [(j, *tb[j]) for j in range(j1, j2) if _is_content(*tb[j]) and tb[j][1] not in ca]
        if not left and not right:
            continue  # function words, or words the other prompt has elsewhere
        if not left or not right:
            return None  # an insertion or deletion: a rewording, not a swap
        if len(left) > 2 or len(right) > 2:
            return None
        raws = [r for _, r, _ in left + right]
        if len({ACTIONS.get(r) for r in raws}) == 1 and raws[0] in ACTIONS:
            continue  # two verbs of one action: "kill"/"stop" a process
        known = all(r in ACTIONS for r in raws)  # two different known operations: not a paraphrase
        if _verb_slot(ta, left[0][0]) and _verb_slot(tb, right[0][0]) and not known:
            continue  # "How do I make/prepare/find ...": paraphrases swap the leading verb freely
        swaps.append((" ".join(c for _, _, c in left), " ".join(c for _, _, c in right)))
    if len(swaps) != 1 or len(ta) < 3:
        return None
    return swaps[0]


def reworded(a: str, b: str) -> tuple[frozenset[str], frozenset[str]]:
    """The canonical content words only `a` has and only `b` has."""
    ca = {c for r, c in _tokens(a) if _is_content(r, c)}
    cb = {c for r, c in _tokens(b) if _is_content(r, c)}
    return frozenset(ca - cb), frozenset(cb - ca)


# ---------------------------------------------------------------- the comparison


@dataclass(frozen=True)
class Facts:
    numbers: tuple[str, ...]
    quoted: frozenset[str]
    identifiers: frozenset[str]
    negated: bool
    entities: frozenset[str]
    technologies: frozenset[str]
    directions: frozenset[tuple[str, str]]
    actions: frozenset[str]
    qualifiers: frozenset[str] = field(default_factory=frozenset)
    conversions: frozenset[tuple[str, str]] = field(default_factory=frozenset)
    words: frozenset[str] = field(default_factory=frozenset)  # for matching the other side's entities


@lru_cache(maxsize=4096)
def facts(text: str) -> Facts:
    text = expand_abbreviations(text)
    return Facts(
        numbers=numbers(text), quoted=quoted(text), identifiers=identifiers(text), negated=negated(text),
        entities=entities(text), technologies=technologies(text), directions=directions(text),
        actions=actions(text), qualifiers=qualifiers(text), conversions=conversions(text),
        words=frozenset(w for pair in words(text) for w in pair) | _entity_words(text),
    )


def _entity_words(text: str) -> frozenset[str]:
    return frozenset(w.lower().removesuffix("'s") for w in re.findall(r"[A-Za-z][A-Za-z0-9'\-]*", text))


def _names_only_in(fa: Facts, fb: Facts) -> set[str]:
    """Names (capitalised words, acronyms) of `fa` that `fb` does not mention in any form."""
    return {e for e in fa.entities if e not in fb.words and canonical(e) not in fb.words}


def _opposite_actions(fa: Facts, fb: Facts) -> bool:
    """A verb on one side whose opposite is named (add/remove, create/delete...)."""
    return any(frozenset((x, y)) in OPPOSITE_ACTIONS for x in fa.actions ^ fb.actions for y in fa.actions | fb.actions)


def _direction_conflict(da: frozenset[tuple[str, str]], db: frozenset[tuple[str, str]]) -> bool:
    for group in {g for g, _ in da | db}:
        pa = {p for g, p in da if g == group}
        pb = {p for g, p in db if g == group}
        if pa != pb and (group not in PAIRED_ONLY or (pa and pb)):
            return True
    return False


# Below this similarity a soft difference (see the module docstring) refuses the hit.
SOFT_SIMILARITY = 0.86


def compare(a: str, b: str, similarity: float | None = None) -> str | None:
    """None when `a`'s answer may serve `b`; otherwise the name of the first disagreement.

    `similarity` is the embedding similarity of the two prompts; soft differences (an extra name
    on one side only, reworded content words on both sides) pass only at SOFT_SIMILARITY or above.
    Without it they always refuse.
    """
    if (spelling := respelled(a, b)) is not None:
        return spelling
    fa, fb = facts(a), facts(b)
    if fa.numbers != fb.numbers:
        return "numbers"
    if fa.quoted != fb.quoted:
        return "quoted"
    if fa.identifiers != fb.identifiers:
        return "identifiers"
    if fa.negated != fb.negated:
        return "negation"
    if fa.technologies != fb.technologies:
        return "technology"
    only_a, only_b = _names_only_in(fa, fb), _names_only_in(fb, fa)
    if only_a and only_b:
        return "entities"  # a swapped name: France/Germany
    if _direction_conflict(fa.directions, fb.directions):
        return "direction"
    if _opposite_actions(fa, fb):
        return "action"
    if bool(fa.actions) != bool(fb.actions) and (fa.actions | fb.actions) & CHANGING_ACTIONS:
        return "action"  # "remove the first character" / "get the first character"
    if fa.qualifiers != fb.qualifiers:
        return "qualifier"
    if any((y, x) in fb.conversions for (x, y) in fa.conversions):
        return "conversion"
    if reversed_relation(a, b) is not None:
        return "reversed"
    if substitution(a, b) is not None:
        return "substitution"
    soft = similarity is None or similarity < SOFT_SIMILARITY
    if soft and (only_a or only_b):
        return "extra entity"
    ra, rb = reworded(a, b)
    if soft and ra and rb:
        return "reworded"
    return None


def _swapped(only_a: set | frozenset, only_b: set | frozenset) -> bool:
    """Each side has a value the other lacks: a replacement, not an addition or an omission."""
    return bool(only_a) and bool(only_b)


def _missing_from(values: frozenset[str], text: str) -> set[str]:
    """Values (quoted strings, identifiers) that do not occur in `text` even unquoted."""
    flat = re.sub(r"[^a-z0-9]+", " ", text.lower())
    return {v for v in values if re.sub(r"[^a-z0-9]+", " ", v.lower()).strip() not in flat}


def conflict(a: str, b: str) -> str | None:
    """The first fact on which the two prompts contradict each other, or None.

    The guard for when a reuse judge reads the prompts too (localspec.cache.judge). `compare`
    refuses whenever a fact is stated on one side only; on unseen wording that refused most real
    paraphrases ("7 cubed" / "7 to the power of 3", "kubectl list pods" / "list the pods", a name
    in backticks on one side). Here a fact refuses only when both sides state it differently: a
    technology, name, quoted string or identifier replaced by another, opposite direction words,
    opposite actions, qualifiers, reversed conversions, one word swapped in place; and, stricter,
    any difference in the numbers or a negation on one side (one-sided, those are how most number
    and negation traps read). What one side adds or leaves out otherwise is left to the judge.
    """
    if (spelling := respelled(a, b)) is not None:  # a fact both sides state, written otherwise
        return spelling
    fa, fb = facts(a), facts(b)
    # Numbers as multisets ("18 of 72" / "72 ... 18"), but every one must match: a count added on
    # one side ("a cup" / "3 cups", "the last commit" / "the last 3 commits") is a trap far more
    # often than a paraphrase.
    if sorted(fa.numbers) != sorted(fb.numbers):
        return "numbers"
    if _swapped(_missing_from(fa.quoted | fa.identifiers, b), _missing_from(fb.quoted | fb.identifiers, a)):
        return "quoted" if fa.quoted or fb.quoted else "identifiers"
    if fa.negated != fb.negated:
        return "negation"
    if _swapped(fa.technologies - fb.technologies, fb.technologies - fa.technologies):
        return "technology"
    only_a, only_b = _names_only_in(fa, fb), _names_only_in(fb, fa)
    if _swapped(only_a, only_b):
        return "entities"
    for group in {g for g, _ in fa.directions} & {g for g, _ in fb.directions}:
        if {p for g, p in fa.directions if g == group} != {p for g, p in fb.directions if g == group}:
            return "direction"
    if _opposite_actions(fa, fb):
        return "action"
    if fa.qualifiers != fb.qualifiers:
        return "qualifier"
    if any((y, x) in fb.conversions for (x, y) in fa.conversions):
        return "conversion"
    if reversed_relation(a, b) is not None:  # "144 divided by 12" / "12 divided by 144"
        return "reversed"
    if substitution(a, b) is not None:  # "with requests" / "with httpx": one word swapped in place
        return "substitution"
    return None


def agrees(a: str, b: str, similarity: float | None = None) -> bool:
    return compare(a, b, similarity) is None
