"""Normal forms of a prompt: the exact-match key, and the canonical words the guard compares.

`normalize_prompt` is the exact-match key: two prompts with the same key are the same request.

`words` is what the false-hit guard compares word by word: lower-cased, idioms rewritten to one
word ("get rid of" -> remove, "set up" -> create), irregular forms and simple suffixes folded
("spoken" -> speak, "dictionaries" -> dictionary, "painter" -> paint), and synonyms mapped to one
representative ("dict" -> dictionary, "symptoms" -> sign). The synonym groups only join words that
ask for the same answer; words whose difference changes the answer (remove/hide, sum/mean) are
never joined. `FUNCTION_WORDS` are the words whose presence or absence never changes the answer.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter

_INNER_BLANKS = re.compile(r"(?<=\S)[^\S\n]+")  # a run of blanks after a character: not indentation
_TRAILING = re.compile(r"[\s?.!:;]+$")
_PRONOUN_I = re.compile(r"\bI\b")
_WORD_RUN = re.compile(r"\w+")


def _capitalized(word: str) -> str:
    return word.lower() if len(word) > 1 and word[1:].islower() else word


def case_folded(text: str) -> str:
    """Only the case that is not meaning folded: a capital on a word's first letter alone, over two
    letters or more (a name, a sentence's start: "France" / "france", "How" / "how"), and the pronoun I.
    All capitals, inner capitals and single letters are kept: in code and in quoted text they are
    meaning ("FOO" / "foo", x / X, getUser / getuser). The cost: "Foo" and "foo" are one word here."""
    return _WORD_RUN.sub(lambda m: _capitalized(m.group()), _PRONOUN_I.sub("i", text))


def normalize_prompt(text: str) -> str:
    """NFKC; blanks inside a line collapsed; a one-line prompt stripped, a longer one's line breaks and
    every line's indentation kept (code); trailing punctuation dropped; case folded only as
    `case_folded` says.

    Before, case was folded and every whitespace run collapsed: "Repeat this exactly: FOO" was
    answered "foo", and a class indented by two spaces got the body cached for four.
    """
    lines = [_INNER_BLANKS.sub(" ", line).rstrip() for line in unicodedata.normalize("NFKC", text).splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    t = lines[0].strip() if len(lines) == 1 else "\n".join(lines)
    return case_folded(_TRAILING.sub("", t))


_INDENT = re.compile(r"[^\S\n]*")


def respelled(a: str, b: str) -> str | None:
    """"case" where a word stands in other letters' case on the other side ("FOO" / "foo", x / X), past what
    `case_folded` folds; "layout" where a line stands at another indentation. Every other rule reads
    words; these two differences change the answer to "repeat this exactly" and to code."""
    wa, wb = (Counter(_WORD_RUN.findall(case_folded(t))) for t in (a, b))
    if {w.casefold() for w in wa - wb} & {w.casefold() for w in wb - wa}:  # counted: "x == X" / "x == x"
        return "case"
    lines_a, lines_b = ([line for line in t.splitlines() if line.strip()] for t in (a, b))
    if len(lines_a) < 2 or len(lines_b) < 2:  # a one-line prompt's indentation is no layout (the key strips it)
        return None
    indents: dict[str, set[str]] = {}
    for line in lines_a:
        indents.setdefault(" ".join(line.split()), set()).add(_INDENT.match(line).group())  # type: ignore[union-attr]
    for line in lines_b:
        content = " ".join(line.split())
        if content in indents and _INDENT.match(line).group() not in indents[content]:  # type: ignore[union-attr]
            return "layout"
    return None


# ---------------------------------------------------------------- idioms

# Multi-word phrases that mean one word; rewritten before the text is split into words.
_DURATION_UNITS = r"(?:seconds|minutes|hours)"  # "how many days are in a year" is a count, not a duration
_PHRASES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(p, re.IGNORECASE), r) for p, r in [
        (r"\bget(?:ting)? rid of\b", "remove"),
        (r"\bmake (.{1,40}?) go away\b", r"remove \1"),
        (r"\bmake (.{1,30}?) (?:bigger|larger)\b", r"increase \1"),
        (r"\bmake (.{1,30}?) smaller\b", r"decrease \1"),
        (r"\bset(?:ting)? up\b", "create"),
        (r"\bmore than one\b", "multiple"),
        (r"\bhow many " + _DURATION_UNITS + r"\b", "how long"),
        (r"\bhow many\b", "number of"),
        (r"\bhow much\b", "amount of"),
        (r"\bdoes it take\b", ""),
        (r"\bwhole numbers?\b", "integer"),
        (r"\b(?:most recent|latest)\b", "last"),
        (r"\b(?:one|a) (\w+) at a time\b", r"\1 by \1"),
        (r"\bcome to an end\b", "end"),
        (r"\b(?:turn|switch)(?:ing)? on\b", "enable"),
        (r"\b(?:turn|switch)(?:ing)? off\b", "disable"),
        (r"\b(?:find|figure|look|work)(?:ing)? out\b", "find"),
        (r"\blook(?:ing)? up\b", "find"),
        (r"\bkeep(?:ing)? only\b", "filter"),
        (r"\bpretty[- ]?print(?:ing|ed)?\b", "format print"),
        (r"\bnicely formatted\b", "format"),
        (r"\b(?:per|each|every|a) (day|night|week|month|year)\b", r"per \1"),
        (r"\bdaily\b", "per day"),
        (r"\bnested (list|array|dictionary|dict)s?\b", r"\1 of \1"),
        (r"\bwhat do you get when you\b", "what is"),
        (r"\badd(?:s|ed)? up\b", "sum"),
        (r"\bhash ?maps?\b", "dictionary"),
        (r"\braise(s|d)? (an? )?(error|exception)", r"throw\1 \2\3"),
        (r"\b(\d[\d.,]*) times (\d)", r"\1 multiplied by \2"),
        (r"\b(\d[\d.,]*) plus (\d)", r"\1 sum \2"),
        (r"\badd(?:ing)? (\d[\d.,]*) (?:and|to|plus) (\d)", r"sum of \1 and \2"),
        (r"\bof the world\b|\bin the world\b|\bon earth\b|\bon the planet\b", "in world"),
        (r"\bworld's\b", "world"),
    ]
]


# ---------------------------------------------------------------- word forms

_IRREGULAR = {
    "spoken": "speak", "spoke": "speak", "written": "write", "wrote": "write", "ran": "run", "drank": "drink",
    "drunk": "drink", "ate": "eat", "eaten": "eat", "took": "take", "taken": "take", "gave": "give",
    "given": "give", "made": "make", "began": "begin", "begun": "begin", "chose": "choose", "chosen": "choose",
    "built": "build", "bought": "buy", "sold": "sell", "sent": "send", "got": "get", "gotten": "get",
    "went": "go", "gone": "go", "did": "do", "done": "do", "saw": "see", "seen": "see", "knew": "know",
    "known": "know", "grew": "grow", "grown": "grow", "threw": "throw", "thrown": "throw", "fell": "fall",
    "fallen": "fall", "broke": "break", "broken": "break", "drew": "draw", "drawn": "draw", "flew": "fly",
    "flown": "fly", "held": "hold", "kept": "keep", "lost": "lose", "won": "win", "said": "say", "told": "tell",
    "thought": "think", "brought": "bring", "taught": "teach", "caught": "catch", "felt": "feel", "meant": "mean",
    "paid": "pay", "led": "lead", "children": "child", "men": "man", "women": "woman", "people": "person",
    "feet": "foot", "teeth": "tooth", "mice": "mouse", "indices": "index", "indexes": "index", "data": "data",
    "analyses": "analysis", "bases": "base", "criteria": "criterion", "matrices": "matrix", "vertices": "vertex",
    # agent nouns: "who is the painter of" asks what "who painted" asks
    "author": "write", "writer": "write", "painter": "paint", "speaker": "speak", "creator": "create",
    "inventor": "invent", "founder": "found", "discoverer": "discover", "composer": "compose",
    "director": "direct", "builder": "build", "designer": "design", "developer": "develop",
}
# Words the suffix rules would mangle into another word.
_KEEP = {"this", "is", "was", "has", "does", "its", "his", "bus", "gas", "class", "process", "access", "less",
         "news", "series", "species", "physics", "mathematics", "analysis", "basis", "axis", "alias", "status",
         "bias", "canvas", "atlas", "yes", "always", "perhaps", "thus", "plus", "minus", "versus", "various",
         "previous", "famous", "obvious", "serious", "us", "as", "during", "string", "thing", "nothing",
         "something", "anything", "everything", "ring", "king", "spring", "bring", "sing", "swing", "ceiling",
         "bed", "need", "speed", "seed", "feed", "red", "shed", "hundred", "embed", "bleed", "breed", "proceed",
         "exceed", "succeed", "fixed", "only", "early", "reply", "apply", "supply", "fly", "july", "italy",
         "family", "daily", "weekly", "monthly", "yearly", "hourly", "ugly", "holy", "rely", "belly", "jelly"}


def _stem(w: str) -> str:
    """A light, consistent stemmer: the forms of one word meet; readable stems are not the aim."""
    if w in _IRREGULAR:
        return _IRREGULAR[w]
    if w in _KEEP or len(w) <= 3 or not w.isalpha():
        return w
    if w.endswith("ies") and len(w) > 4:
        w = w[:-3] + "i"
    elif w.endswith(("sses", "shes", "ches", "xes", "zes")):
        w = w[:-2]
    elif w.endswith("s") and not w.endswith(("ss", "us", "is")):
        w = w[:-1]
    elif w.endswith("ing") and len(w) > 5:
        w = w[:-3]
        if len(w) > 2 and w[-1] == w[-2] and w[-1] not in "lsz":
            w = w[:-1]
    elif w.endswith("ied") and len(w) > 4:
        w = w[:-3] + "i"
    elif w.endswith("ed") and len(w) > 4:
        w = w[:-2]
        if len(w) > 2 and w[-1] == w[-2] and w[-1] not in "lsz":
            w = w[:-1]
    elif w.endswith("ly") and len(w) > 5:
        w = w[:-2]
    for suffix in ("ation", "ition", "ment", "ness", "ence", "ance", "ent", "ity"):
        if w.endswith(suffix) and len(w) - len(suffix) >= 4:
            w = w[: -len(suffix)]
            break
    if len(w) > 3 and w.endswith("y") and w[-2] not in "aeiou":
        w = w[:-1] + "i"  # "query"/"queries", "calorie"/"calories" meet at "queri", "calori"
    return w[:-1] if len(w) > 3 and w.endswith("e") else w


# ---------------------------------------------------------------- synonyms

# representative: words asking for the same thing. Members are stemmed before lookup.
_SYNONYM_GROUPS = {
    "remove": "delete erase eliminate discard rid drop strip clean",
    "exist": "present contain",
    "fly": "flight",
    "file": "archive",
    "combine": "merge join concatenate",
    "dictionary": "dict hashmap",
    "get": "fetch obtain retrieve grab access acquire",
    "find": "determine locate identify detect search discover",
    "make": "create build generate produce new setup draw",
    "read": "load",
    "begin": "start launch",
    "change": "modify update edit alter convert turn transform",
    "print": "display output",
    "error": "exception",
    "calculate": "compute",
    "element": "item entry member",
    "directory": "folder",
    "image": "picture photo",
    "buy": "purchase",
    "big": "large huge",
    "biggest": "largest",
    "easy": "simple simplest easiest",
    "last": "final",
    "first": "initial",
    "small": "little tiny",
    "fast": "quick speedy rapid speed",
    "check": "verify tell see whether",
    "stop": "halt",
    "kill": "terminate",
    "string": "str",
    "integer": "int",
    "number": "numeric num count",
    "function": "func",
    "many": "much",
    "loop": "iterate traverse",
    "length": "size len",
    "happen": "occur",
    "multiply": "multiplied product",
    "sum": "total",
    "answer": "reply response",
    "person": "man human individual",
    "money": "currency cash",
    "car": "automobile",
    "sign": "symptom indication",
    "difference": "differ different vs versus compare comparison distinguish",
    "maximum": "max",
    "minimum": "min",
    "tallest": "highest",
    "chart": "plot graph diagram",
    "format": "prettify",
    "filter": "select",
    "speak": "talk",
    "travel": "visit trip",
    "holiday": "vacation",
    "pack": "bring",
    "increase": "raise improve boost",
    "nation": "country",
    "neighbor": "neighbour border",
    "repository": "repo",
    "position": "index location place",
    "declare": "define",
    "throw": "raise",
    "pause": "sleep wait delay",
    "intake": "drink consume",
    "main": "primary principal major",
    "cause": "reason",
    "handle": "manage",
    "mean": "average avg",
    "all": "every each",
    "percent": "percentage",
    "copy": "clone",
}
SYNONYMS: dict[str, str] = {}
for _canon in _SYNONYM_GROUPS:  # a representative is never another group's member
    SYNONYMS[_stem(_canon)] = _stem(_canon)
for _canon, _members in _SYNONYM_GROUPS.items():
    for _m in _members.split():
        SYNONYMS.setdefault(_stem(_m), _stem(_canon))


# ---------------------------------------------------------------- function words

# Words whose presence or absence never changes the answer: articles, pronouns, auxiliaries, the
# frame of a question ("what's the way to", "is there a simple command for") and politeness.
FUNCTION_WORDS = frozenset(
    """
    a an the of in on at to for from with by into onto about as and or but if so than then that this these those
    is are was were be been being am do does did done doing have has had having can could should would will
    shall may might must i me my we our us you your it its they them their he she his her there here what whats
    what's which who whom whose when where why how hows how's way ways best good right proper correct
    quick quickest common standard recommended ideal please tell explain show give me
    let lets let's want wanna need needs like would i'd i'm any some anyone someone possible able
    command commands method methods approach technique syntax code snippet example examples formula
    use used using uses via python's just also really actually exactly one's own get got query return returns
    kind thing things something anything one ones nice nicely properly correctly amount
    done someone somebody whether together inside within over through across between
    """.split()
)


# ---------------------------------------------------------------- canonical words

_WORD = re.compile(r"[a-z0-9][a-z0-9+#']*")


def raw_words(text: str) -> list[str]:
    """Lower-cased words after idioms are rewritten, possessives dropped."""
    t = unicodedata.normalize("NFKC", text).replace("’", "'")
    for rx, repl in _PHRASES:
        t = rx.sub(repl, t)
    return [w.removesuffix("'s").removesuffix("'") for w in _WORD.findall(t.lower())]


def canonical(word: str) -> str:
    """One word's canonical form: stemmed, then mapped to its synonym group's representative."""
    s = _stem(word)
    return SYNONYMS.get(s, s)


def words(text: str) -> list[tuple[str, str]]:
    """(raw, canonical) for every word of `text`, in order."""
    return [(w, canonical(w)) for w in raw_words(text)]


def content_words(text: str) -> list[str]:
    """Canonical forms of the words that are not function words, in order."""
    return [c for w, c in words(text) if w not in FUNCTION_WORDS and c not in FUNCTION_WORDS]
