"""The numbers in a prompt, written or spelled out, for the false-hit guard: "7 cubed" is not "8 cubed".

Number words ("twenty-one", "one hundred and five"), ordinals, multiples and Roman numerals become
digits; digits inside a name ("k8s", "log4j") stay part of it.
"""

from __future__ import annotations

import re

from localspec.cache.guard_lexicon import MULTIPLES, NOT_COUNTING, ORDINALS, SCALES, TENS, UNITS

# A sign only where a number starts ("2024-03-15" and "1-5" hold no negative numbers). Digits may
# follow a name ("SHA256" = "SHA-256", "JUnit5" = "JUnit 5") and carry a short unit ("2kg" = "2 kg");
# digits inside a word ("k8s", "i18n", "log4j") are part of it, not a number.
_NUM_TOKEN = re.compile(
    r"(?:(?<![\w.])[-+])?(?<!\d\.)(?<!\d)(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)*(?:e[-+]?\d+)?(?:[A-Za-z]{1,3})?(?![\w])"
    r"|[A-Za-z]+",
)


def _num_str(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


_ROMAN = re.compile(r"(?<![\w-])(?=[IVX]{2,}\b)X{0,3}(?:IX|IV|V?I{0,3})(?![\w-])")
_ROMAN_VALUES = {"I": 1, "V": 5, "X": 10}


def _roman(m: re.Match[str]) -> str:
    """ "II" -> "2" (upper-case numerals of two letters or more; a lone "I" is the pronoun)."""
    vals = [_ROMAN_VALUES[c] for c in m.group(0)]
    return str(sum(-v if i + 1 < len(vals) and v < vals[i + 1] else v for i, v in enumerate(vals)))


def roman_as_digits(text: str) -> str:
    return _ROMAN.sub(_roman, text)


def numbers(text: str) -> tuple[str, ...]:
    """Numbers in order of appearance; number words and Roman numerals become digits.

    A lone "one" ("in one line", "one file") is the article "a" in disguise and is dropped unless
    the prompt holds another number: "one plus one" still differs from "one plus two".
    """
    text = roman_as_digits(text)
    text = re.sub(r"(?<=\d)\s*[x×]\s*(?=\d)", " by ", text)  # "3x3" = "3 by 3"
    out = _numbers(text)
    if out == ("1",) and not re.search(r"(?<![\w.])1(?![\w.])", text):
        return ()
    return out


def _numbers(text: str) -> tuple[str, ...]:
    out: list[str] = []
    acc: float | None = None  # a number being spelled out in words

    def flush() -> None:
        nonlocal acc
        if acc is not None:
            out.append(_num_str(acc))
            acc = None

    prev = ""
    for m in _NUM_TOKEN.finditer(text):
        tok = m.group(0)
        low = tok.lower()
        if tok[0].isdigit() or tok[0] in "+-" and len(tok) > 1:
            flush()
            suffix = re.search(r"[A-Za-z]+$", tok)
            if m.start() > 0 and text[m.start() - 1].isalpha() and (suffix or text[max(m.start() - 2, 0)].isdigit()):
                continue  # "k8s", "a1b2c3": a name with digits in it
            digits = tok[:suffix.start()] if suffix else tok
            digits = digits.replace(",", "")
            try:
                out.append(_num_str(float(digits)))
            except ValueError:
                out.append(digits)
        elif low in UNITS:
            if low == "one" and (prev in NOT_COUNTING or text[m.end():m.end() + 1] == "-"):
                flush()  # "which one", "one-liner": not a count
            elif acc is not None and ((acc % 10 == 0 and acc % 100 >= 20) or (acc >= 100 and acc % 100 == 0)):
                acc += UNITS[low]
            else:
                flush()
                acc = UNITS[low]
        elif low in TENS:
            if acc is not None and acc % 100 != 0:
                flush()
            acc = (acc or 0) + TENS[low]
        elif low in SCALES and acc is not None:
            acc *= SCALES[low]
        elif low in SCALES:
            acc = SCALES[low]
        elif low in ORDINALS and not (low == "second" and prev in ("per", "a", "one", "each", "every")):
            flush()
            out.append(_num_str(ORDINALS[low]))
        elif low in MULTIPLES:
            flush()
            out.append(_num_str(MULTIPLES[low]))
        elif low == "and" and acc is not None and acc >= 100:
            continue  # "one hundred and five"
        else:
            flush()
        prev = low
    flush()
    return tuple(out)
