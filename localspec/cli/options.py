"""Command-line options that more than one verb takes, and the old spellings kept working."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

# The same names as localspec.cache.policy.CACHE_JUDGES, spelled out so that building the parser
# does not import the cache (and numpy, diskcache) for every command.
CACHE_JUDGES = ("model", "scorer", "rules")
# localspec.engine.config.MODES, likewise (the engine imports numpy and pydantic; tab completion
# builds the parser on every key press). tests/test_cli_options.py checks that the two agree.
MODES = ("auto", "off", "draft", "lookup")
CACHE_JUDGE_HELP = ("with --cache-semantic, who confirms a near-duplicate: the answering model (about 2-3 s on a "
                    "CPU), the learned pair scorer (milliseconds, fewer hits), or the guard's rules alone")

LORA_HELP = ("apply this LoRA adapter GGUF to the target model, scaled by SCALE (default 1.0); the draft model "
             "runs without it. Checked against the target before it loads")


@contextmanager
def checked_flags(verb: str) -> Iterator[None]:
    """Flag values checked by the engine's own models (pydantic): a value out of range is a usage error
    naming the field (exit status 2), raised before any model loads, never a traceback."""
    from pydantic import ValidationError

    from localspec.errors import UsageError

    try:
        yield
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "request"
        raise UsageError(f"Invalid {field}: {err['msg']}.", f"See `localspec {verb} --help`.") from exc


def utf8_text(text: str, what: str) -> str:
    """`text` as given, refused when it holds bytes that are not UTF-8. Python keeps such bytes of argv
    and standard input as lone surrogates, which the tokenizer cannot encode: a traceback once the
    models had loaded. Refused, not replaced, so that a prompt never reaches a model other than as typed."""
    from localspec.errors import UsageError

    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = ord(text[exc.start])
        byte = f"byte 0x{bad - 0xDC00:02x}" if 0xDC80 <= bad <= 0xDCFF else f"U+{bad:04X}"
        raise UsageError(f"{what} is not valid UTF-8 ({byte} at character {exc.start}).",
                         "Convert it to UTF-8 first, e.g. `iconv -f latin1 -t utf-8`.") from None
    return text


def add_lora_argument(p: argparse.ArgumentParser) -> None:
    """--lora PATH[:SCALE]; kept a string here (parsed by localspec.models.adapters when a verb runs),
    so that building the parser imports nothing heavy."""
    p.add_argument("--lora", metavar="PATH[:SCALE]", help=LORA_HELP)


class DeprecatedAlias(argparse.Action):
    """An old option spelling: hidden from --help, it stores what its replacement would and says,
    in one line on stderr, which spelling to use, so that existing scripts keep working.

    `values` maps the old spelling's values to the new ones (e.g. `--judge none` -> `rules`); with
    `nargs=0` the alias is a flag that stores `const`.
    """

    def __init__(self, option_strings: list[str], dest: str, *, replacement: str,
                 values: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self.replacement = replacement
        self.value_map = dict(values or {})
        if self.value_map and "choices" not in kwargs:
            kwargs["choices"] = tuple(self.value_map)
        kwargs["help"] = argparse.SUPPRESS
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        given = option_string if self.nargs == 0 else f"{option_string} {values}"
        value = self.const if self.nargs == 0 else self.value_map.get(values, values)
        print(f"localspec: {given} is deprecated; use {self.replacement}", file=sys.stderr)
        setattr(namespace, self.dest, value)


def add_deprecated_flag(p: argparse.ArgumentParser, old: str, *, dest: str, const: Any, replacement: str) -> None:
    """`old` (no value) does what `replacement` does, with a one-line note."""
    p.add_argument(old, dest=dest, action=DeprecatedAlias, nargs=0, const=const, replacement=replacement)


def add_deprecated_option(p: argparse.ArgumentParser, old: str, *, dest: str, replacement: str,
                          values: Mapping[str, Any] | None = None, type: Any = None) -> None:
    """`old VALUE` stores VALUE (mapped through `values`) in `dest`, with a one-line note."""
    p.add_argument(old, dest=dest, action=DeprecatedAlias, replacement=replacement, values=values, type=type,
                   metavar="VALUE")


def add_cache_judge_arguments(p: argparse.ArgumentParser, *, default: str | None = "model") -> None:
    """`--cache-judge model|scorer|rules`: one spelling and one set of values for `serve`, `chat` and
    `cache eval`. The older `--no-cache-judge` still works, with a deprecation note. `default=None`
    leaves an unset flag to the settings ([cache] judge)."""
    p.add_argument("--cache-judge", choices=CACHE_JUDGES, default=default, help=CACHE_JUDGE_HELP)
    add_deprecated_flag(p, "--no-cache-judge", dest="cache_judge", const="rules", replacement="--cache-judge rules")
