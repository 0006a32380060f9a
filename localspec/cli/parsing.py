"""Walks over the built parser: defaults in every --help, and tab completion of ids and profiles."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from typing import Any

# Option destinations whose values are model ids or profile names, completed from the registry.
_MODEL_DESTS = frozenset({"id", "ids", "model", "draft_model", "judge_model"})
_PROFILE_DESTS = frozenset({"profile"})
_VALUE_ACTIONS = (argparse._StoreAction, argparse._AppendAction)


def subcommands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
                ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser below `parser` with its verb path, e.g. (("models", "list"), <parser>)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, child in action.choices.items():
                if id(child) in seen:  # an alias of a verb already listed
                    continue
                seen.add(id(child))
                yield (*path, name), child
                yield from subcommands(child, (*path, name))


def leaf_commands(parser: argparse.ArgumentParser) -> list[tuple[str, ...]]:
    """The verb paths that run something (no further verbs below them)."""
    paths = [p for p, _ in subcommands(parser)]
    return [p for p in paths if not any(q[: len(p)] == p and len(q) > len(p) for q in paths)]


def _shows_default(action: argparse.Action) -> bool:
    if not action.option_strings or action.help == argparse.SUPPRESS:
        return False
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction,
                           argparse._HelpAction, argparse._VersionAction)):
        return False
    default = action.default
    return default not in (None, "", [], argparse.SUPPRESS) and not isinstance(default, bool)


def show_defaults(parser: argparse.ArgumentParser) -> None:
    """Append "(default: X)" to the help of every option whose help does not state its default."""
    for p in [parser, *(child for _, child in subcommands(parser))]:
        for action in p._actions:
            if not _shows_default(action):
                continue
            text = action.help or ""
            if re.search(rf"(?<![\w.]){re.escape(str(action.default))}(?![\w.])", text):
                continue  # the help says it already, e.g. "(default 8000)"
            action.help = f"{text} (default: %(default)s)".strip()


def _registry_names(kind: str) -> list[str]:
    """Model ids (with aliases and store-only imports) or profile names; nothing when unreadable."""
    try:
        from localspec.models import ModelManager

        mm = ModelManager()
        if kind == "profiles":
            return sorted(mm.registry.profiles)
        names = set(mm.registry.ids()) | {a for m in mm.registry.models.values() for a in m.aliases}
        names |= {m.model_id for m in mm.store.manifests()}
        return sorted(names)
    except Exception:  # a broken overlay must not break the shell; `localspec models list` says why
        return []


def _complete_models(prefix: str, **_: Any) -> list[str]:
    return [n for n in _registry_names("models") if n.startswith(prefix)]


def _complete_profiles(prefix: str, **_: Any) -> list[str]:
    return [n for n in _registry_names("profiles") if n.startswith(prefix)]


def attach_completers(parser: argparse.ArgumentParser) -> None:
    """Tab completion of model ids and profile names wherever an option or argument takes one."""
    for p in [parser, *(child for _, child in subcommands(parser))]:
        for action in p._actions:
            if not isinstance(action, _VALUE_ACTIONS) or action.choices:
                continue
            # argcomplete reads a `completer` attribute that argparse's actions do not declare.
            if action.dest in _MODEL_DESTS:
                action.completer = _complete_models  # type: ignore[union-attr]
            elif action.dest in _PROFILE_DESTS:
                action.completer = _complete_profiles  # type: ignore[union-attr]
