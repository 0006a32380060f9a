"""Every verb of the command line, as a newcomer meets it: at 80 columns, piped into `head -1`.

The verbs come from the argparse parser itself, so a new verb is covered without editing this file
(its --help through a real pipe, a wrong option, the defaults in its help) and the test then asks
for a real invocation of it in CALLS. Each call runs in a subprocess with a temp LOCALSPEC_HOME and,
unless it needs the real models, an empty model store, so that it finishes in about a second:

- once with its output captured: the exit status (0 success, 1 runtime failure, 2 usage error), no
  traceback, `--json` output that parses, tables within 80 columns, ids never cut to "…";
- once through `| head -1` (a real pipe that closes early), each call that prints data: no
  traceback, and status 0, or 141 when the closed pipe stopped it (as for `yes | head -1`).

Calls that would load models or run for minutes get arguments that make them finish quickly:
`serve` and `generate` fail early (no key off loopback, a model not installed, a flag that does not
parse) and `generate --json` runs the 0.5B model for 4 tokens when it is installed; `bench` reads a
missing result file; `chat` (stdin not a terminal) prints its help; `cache eval` runs exact-match
on 6 pairs; `router eval` reads the shipped outcomes; `service` runs with --dry-run or fails on a
missing unit.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.gguf_factory import make_gguf
from tests.common import DRAFT_ID, REPO, SHARED_STORE
from localspec.cli import build_parser, main
from localspec.cli.parsing import leaf_commands, subcommands

PARSER = build_parser()
LEAVES = leaf_commands(PARSER)
EXIT_PIPE_CLOSED = 141


@dataclass(frozen=True)
class Call:
    args: tuple[str, ...]
    code: int  # the exit status it must end with
    json: bool = False  # standard output is one JSON document
    ndjson: bool = False  # standard output is JSON lines (pull's progress, then its results)
    table: bool = False  # a table: every line within 80 columns
    shows: tuple[str, ...] = ()  # strings (ids) that must appear whole
    models: bool = False  # needs the real models (the shared store), else an empty store


@dataclass
class Workspace:
    root: Path
    port: int
    registry_ids: tuple[str, ...]
    files: dict[str, Path] = field(default_factory=dict)

    def env(self, phase: str, models: bool) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("LOCALSPEC_API_KEY", "XDG_CONFIG_HOME", "_ARGCOMPLETE")}
        # HF_HUB_OFFLINE: no call may depend on reaching the Hub (`models search` then answers from the
        # registry and says in one line why the Hub was not asked).
        env.update(PYTHONPATH=str(REPO), COLUMNS="80", LOCALSPEC_HOME=str(self.root / phase / "home"),
                   HF_HUB_OFFLINE="1",
                   LOCALSPEC_MODEL_DIRS=str(self.root / "model-dirs"),
                   HOME=str(self.root / phase / "user"),
                   LOCALSPEC_MODELS_DIR=str(SHARED_STORE if models else self.root / phase / "store"))
        return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _labels(path: Path) -> Path:
    easy = [f"say hi to {name}" for name in ("ann", "bob", "cy", "dee", "eve", "fay", "gus", "hal", "ivy", "jo")]
    hard = [f"prove that the sum of the first {n} odd numbers is {n} squared, step by step, then compute "
            f"{n} * 17 + 3 and explain every step" for n in range(3, 13)]
    rows = [{"prompt": p, "label": 0} for p in easy] + [{"prompt": p, "label": 1} for p in hard]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _overlay(tiny: Path) -> str:
    """A registry entry for the tiny GGUF, pinned by size and sha256, so that `models pull cli-tiny`
    copies it from LOCALSPEC_MODEL_DIRS (no network) and prints its NDJSON progress."""
    import hashlib

    digest = hashlib.sha256(tiny.read_bytes()).hexdigest()
    return ('[[models]]\nid = "cli-tiny"\nrole = "target"\n\n  [[models.sources]]\n  kind = "file"\n'
            f'  files = [{{ name = "cli-tiny.gguf", size = {tiny.stat().st_size}, sha256 = "{digest}" }}]\n')


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Workspace:
    from localspec.models import ModelManager

    root = tmp_path_factory.mktemp("verbs")
    (root / "model-dirs").mkdir()
    tiny = make_gguf(root / "model-dirs" / "cli-tiny.gguf")
    files = {"tiny": tiny, "overlay": root / "models.toml", "labels": _labels(root / "labels.jsonl"),
             "bad_labels": root / "bad.jsonl", "pairs": root / "pairs.jsonl", "export": root / "export.jsonl",
             "weights": root / "weights.json", "missing": root / "missing.json", "binary": root / "blob.bin",
             "source": root / "add.py"}
    files["binary"].write_bytes(b"\x7fELF\0\0\x01")
    files["source"].write_text("def add(a, b):\n    return a + b\n")
    files["bad_labels"].write_text('{"prompt": "x", "label": 2}\n')
    files["overlay"].write_text(_overlay(tiny))
    files["pairs"].write_text(json.dumps({"a": "x", "b": "y", "label": "hit"}) + "\n")
    ids = tuple(ModelManager().registry.ids())
    return Workspace(root, _free_port(), ids, files)


def calls(ws: Workspace) -> list[tuple[tuple[str, ...], Call]]:
    """What each verb runs, in order (import before info, verify and rm; each phase has its own home)."""
    f, port = ws.files, str(ws.port)
    real = (SHARED_STORE / DRAFT_ID).is_dir()
    qwen_coder = tuple(i for i in ws.registry_ids if "qwen" in i and "coder" in i)  # offline: the registry answers
    out: list[tuple[tuple[str, ...], Call]] = [
        (("models", "list"), Call((), 0, table=True, shows=ws.registry_ids)),
        (("models", "list"), Call(("--json",), 0, json=True, shows=ws.registry_ids)),
        (("models", "search"), Call(("qwen coder",), 1, shows=qwen_coder)),
        (("models", "search"), Call(("qwen", "--json"), 1, json=True, shows=qwen_coder)),
        (("models", "pull"), Call(("no-such-model",), 1)),
        (("models", "pull"), Call(("hf.co/no-such-user",), 2)),
        (("models", "import"), Call((str(f["tiny"]), "--id", "cli-tiny", "--json"), 0, json=True)),
        (("models", "info"), Call(("cli-tiny", "--json"), 0, json=True)),
        (("models", "verify"), Call(("--json",), 0, json=True, shows=("cli-tiny",))),
        (("models", "du"), Call((), 0, shows=("cli-tiny",))),
        (("models", "du"), Call(("--json",), 0, json=True)),
        (("models", "rm"), Call(("cli-tiny", "--json"), 0, json=True)),
        (("models", "rm"), Call(("cli-tiny",), 1)),
        # Last of the models: through `head -1` the closed pipe may stop the pull after its first line.
        (("models", "pull"), Call(("cli-tiny", "--json"), 0, ndjson=True)),
        (("profiles",), Call((), 0, table=True, shows=ws.registry_ids)),
        (("profiles",), Call(("--json",), 0, json=True)),
        (("profiles",), Call(("no-such-profile",), 1)),
        (("generate",), Call(("--no-pull", "hello"), 1)),
        (("generate",), Call(("--max-tokens", "many", "hello"), 2)),
        (("edit",), Call((str(f["binary"]), "tidy it"), 2)),
        (("edit",), Call((str(f["missing"]), "tidy it"), 2)),
        (("chat",), Call((), 0)),
        (("serve",), Call(("--host", "0.0.0.0", "--no-pull"), 2)),
        (("serve",), Call(("--port", "eighty"), 2)),
        (("serve",), Call(("--keep-alive", "soon", "--no-pull"), 2)),
        # No server runs in the workspace: ps and stop say so (ps --json in its one shape).
        (("ps",), Call((), 1)),
        (("ps",), Call(("--json",), 1, json=True)),
        (("stop",), Call(("qwen2.5-coder-1.5b-instruct-q4_k_m",), 1)),
        (("bench",), Call(("--from-json", str(f["missing"])), 1)),
        (("doctor",), Call(("--port", port), 1)),  # the empty store: the default profile is not installed
        (("doctor",), Call(("--json", "--port", port), 1, json=True)),
        (("service", "install"), Call(("--dry-run",), 0)),
        (("service", "install"), Call(("--dry-run", "--host", "0.0.0.0"), 2)),
        (("service", "status"), Call((), 1)),
        (("service", "status"), Call(("--json",), 1, json=True)),
        (("service", "uninstall"), Call(("--no-stop",), 1)),
        (("cache", "stats"), Call(("--json",), 0, json=True)),
        (("cache", "clear"), Call(("--json",), 0, json=True)),
        (("cache", "export"), Call((str(f["export"]),), 0)),
        (("cache", "eval"), Call(("--exact-only", "--limit", "6", "--json"), 0, json=True)),
        (("cache", "train-scorer"), Call(("--out", str(f["weights"]), "--file", str(f["pairs"])), 2)),
        (("router", "eval"), Call(("--from-outcomes", "--no-embedding", "--resamples", "20", "--folds", "2"), 0,
                                  table=True)),
        (("router", "eval"), Call(("--from-outcomes", "--no-embedding", "--resamples", "20", "--folds", "2",
                                   "--json"), 0, json=True)),
        (("router", "train"), Call((str(f["labels"]), "--no-embedding", "--json"), 0, json=True)),
        (("router", "train"), Call((str(f["bad_labels"]), "--no-embedding"), 1)),
        (("stats",), Call(("--since", "last tuesday"), 2)),
        (("stats",), Call(("--json", "--plot"), 2)),
    ]
    if real:  # the real models: one generation, logged, so that `stats` has a row to show
        out += [
            (("generate",), Call(("--no-pull", "--model", DRAFT_ID, "--mode", "off", "--max-tokens", "4", "--n-ctx",
                                  "256", "--threads", "2", "--json", "def add(a, b):"), 0, json=True, models=True)),
            # Four tokens cannot hold the file: the reply is refused (status 1) and nothing is written.
            (("edit",), Call(("--no-pull", "--model", DRAFT_ID, "--mode", "off", "--max-tokens", "4", "--threads", "2",
                              "--json", str(f["source"]), "add a docstring"), 1, json=True, models=True)),
            (("router", "show"), Call(("what is 2+2?", "--json"), 0, json=True, models=True)),
            (("router", "show"), Call(("what is 2+2?",), 0, models=True, shows=(DRAFT_ID,))),
            (("stats",), Call(("--since", "1d"), 0, table=True)),
        ]
    else:
        out.append((("router", "show"), Call(("what is 2+2?", "--json"), 1)))  # the small tier is not installed
    out += [(("stats",), Call(("--json",), 0, json=True)), (("stats",), Call(("--drift",), 0, table=True))]
    return out


@dataclass(frozen=True)
class Outcome:
    leaf: tuple[str, ...]
    call: Call
    piped: bool
    code: int
    out: str
    err: str


def _command(leaf: tuple[str, ...], args: tuple[str, ...], piped: bool) -> list[str]:
    argv = [sys.executable, "-m", "localspec", *leaf, *args]
    # A real pipe into `head -1`, which exits after one line; the status is localspec's.
    return ["bash", "-c", '"$@" | head -1; exit "${PIPESTATUS[0]}"', "localspec", *argv] if piped else argv


def _run(ws: Workspace, phase: str, leaf: tuple[str, ...], call: Call, piped: bool) -> Outcome:
    cwd = ws.root / phase
    proc = subprocess.run(_command(leaf, call.args, piped), capture_output=True, text=True, timeout=240, cwd=cwd,
                          env=ws.env(phase, call.models), stdin=subprocess.DEVNULL)
    return Outcome(leaf, call, piped, proc.returncode, proc.stdout, proc.stderr)


def _phase(ws: Workspace, phase: str, piped: bool, todo: list[tuple[tuple[str, ...], Call]]) -> list[Outcome]:
    (ws.root / phase).mkdir(exist_ok=True)
    return [_run(ws, phase, leaf, call, piped) for leaf, call in todo]


def _problems(o: Outcome) -> Iterator[str]:
    name = " ".join(("localspec", *o.leaf, *o.call.args)) + (" | head -1" if o.piped else "")
    codes = {o.call.code, EXIT_PIPE_CLOSED} if o.piped else {o.call.code}
    if o.code not in codes:
        yield f"{name}: exit status {o.code}, wanted {sorted(codes)}; stderr: {o.err[-800:]}"
    if "Traceback" in o.err or "Exception ignored" in o.err:
        yield f"{name}: a traceback:\n{o.err[-1500:]}"
    if o.piped:
        if len(o.out.splitlines()) > 1:
            yield f"{name}: head -1 let {len(o.out.splitlines())} lines through"
        return
    if "…" in o.out:
        yield f"{name}: output cut with an ellipsis:\n{o.out}"
    documents = [o.out] if o.call.json else [ln for ln in o.out.splitlines() if ln] if o.call.ndjson else []
    for doc in documents:
        try:
            json.loads(doc)
        except ValueError as exc:
            yield f"{name}: --json output does not parse ({exc}):\n{doc[:800]}"
    if o.call.ndjson and not documents:
        yield f"{name}: no JSON lines at all"
    if o.call.table:
        wide = [line for line in o.out.splitlines() if len(line) > 80]
        if wide:
            yield f"{name}: {len(wide)} lines wider than 80 columns, e.g. {wide[0]!r}"
    words = set(o.out.replace('"', " ").replace(",", " ").split())
    missing = [s for s in o.call.shows if s not in words]
    if missing:
        yield f"{name}: these ids are not shown whole: {missing}\n{o.out}"


def _prepare_home(ws: Workspace, phase: str) -> None:
    """The registry overlay, and a week of logged requests so that `stats` prints its tables."""
    from tests.test_metrics import _history, _seed

    home = ws.root / phase / "home"
    (home / "config").mkdir(parents=True)
    (home / "config" / "models.toml").write_text(ws.files["overlay"].read_text())
    (home / "data").mkdir()
    _seed(home / "data" / "metrics.sqlite", _history(time.time(), shifted=True, n=3))


def test_every_call_is_listed_for_every_verb(ws):
    """A new verb needs a real invocation here, and a verb with --json one that uses it."""
    todo = calls(ws)
    assert sorted({leaf for leaf, _ in todo}) == sorted(LEAVES)
    parsers = dict(subcommands(PARSER))
    with_json = {leaf for leaf in LEAVES if any("--json" in a.option_strings for a in parsers[leaf]._actions)}
    real = (SHARED_STORE / DRAFT_ID).is_dir()
    covered = {leaf for leaf, c in todo if (c.json or c.ndjson) and "--json" in c.args}
    assert with_json - covered == (set() if real else {("generate",), ("edit",)})  # their --json needs a model


@pytest.mark.slow  # every verb in a subprocess, twice: a campaign, not a unit test (stage 2)
def test_every_verb_at_80_columns_and_through_head(ws):
    todo = calls(ws)
    for phase in ("full", "piped"):
        _prepare_home(ws, phase)
    # Through the pipe, the calls that print data (a failure prints its one line to stderr alone).
    printing = [(leaf, call) for leaf, call in todo if call.code == 0]
    with ThreadPoolExecutor(2) as pool:  # the two phases in their own homes, side by side
        full = pool.submit(_phase, ws, "full", False, todo)
        piped = pool.submit(_phase, ws, "piped", True, printing)
        outcomes = full.result() + piped.result()
    problems = [p for o in outcomes for p in _problems(o)]
    assert not problems, "\n\n".join(problems)


@pytest.mark.parametrize("leaf", LEAVES, ids=" ".join)
def test_help_through_head_and_a_wrong_option(ws, leaf, capsys):
    """Every verb, found in the parser: `--help | head -1` is its usage line, and a wrong option is
    a usage error (status 2) in one line, not a traceback."""
    (ws.root / "help").mkdir(exist_ok=True)
    o = _run(ws, "help", leaf, Call(("--help",), 0), piped=True)
    assert o.code in (0, EXIT_PIPE_CLOSED) and not o.err, o.err
    assert o.out.startswith(f"usage: localspec {' '.join(leaf)}")
    with pytest.raises(SystemExit) as exc:
        main([*leaf, "--no-such-option"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    # argparse's usage error: the usage, then one line naming what is wrong
    assert err.startswith("usage: localspec") and ": error: " in err.splitlines()[-1] and "Traceback" not in err


def _shown_defaults(parser) -> Iterator[tuple[str, str]]:
    import argparse

    for action in parser._actions:
        default = action.default
        if (action.option_strings and action.help != argparse.SUPPRESS and default not in (None, "", [])
                and not isinstance(default, bool) and default is not argparse.SUPPRESS
                and not isinstance(action, argparse._StoreConstAction)):
            yield action.option_strings[-1], str(default)


@pytest.mark.parametrize("leaf", LEAVES, ids=" ".join)
def test_help_shows_every_default(leaf, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    parser = dict(subcommands(PARSER))[leaf]
    text = " ".join(parser.format_help().split())
    for option, default in _shown_defaults(parser):
        assert default in text, f"`localspec {' '.join(leaf)} --help` does not show {option}'s default {default}"


@pytest.mark.parametrize("leaf", [("generate",), ("edit",), ("chat",), ("serve",)], ids=" ".join)
def test_the_faces_profile_help_names_the_active_profile(leaf):
    """These faces run settings.toml's profile when --profile is not given; generate's help said the registry's."""
    parser = dict(subcommands(PARSER))[leaf]
    text = next(a.help for a in parser._actions if "--profile" in a.option_strings)
    assert "settings.toml" in text or "the active one" in text, text


def _commands_md_rows() -> dict[str, str]:
    """docs/commands.md's table: each top-level command's synopses (a row's first cell; the second says
    what it does, and may name other commands' flags)."""
    import re
    from pathlib import Path

    doc = (Path(__file__).parents[1] / "docs" / "commands.md").read_text(encoding="utf-8")
    rows: dict[str, str] = {}
    for line in doc.splitlines():
        synopsis = line.split(" | ")[0]
        for command in re.findall(r"`localspec ([a-z][a-z-]*)", synopsis) if line.startswith("| `") else []:
            rows[command] = rows.get(command, "") + synopsis
    return rows


def test_commands_md_lists_every_flag_and_no_other():
    """The page promises every flag of every command: one a command gained, or a documented one it
    lost, fails here (stats --by face, cache eval --split all and doctor --calibration were missing)."""
    import argparse
    import re

    rows = _commands_md_rows()
    documented: dict[str, set[str]] = {c: set(re.findall(r"--[a-z][a-z-]*", text)) for c, text in rows.items()}
    real: dict[str, set[str]] = {}
    for leaf, parser in subcommands(PARSER):
        flags = {o for a in parser._actions if a.help != argparse.SUPPRESS for o in a.option_strings
                 if o.startswith("--") and o != "--help"}
        assert leaf[0] in rows, f"docs/commands.md has no row for `localspec {leaf[0]}`"
        missing = sorted(f for f in flags if f not in documented[leaf[0]])
        assert not missing, f"docs/commands.md does not list {missing} of `localspec {' '.join(leaf)}`"
        for action in parser._actions:  # each choice list, as --help shows it
            long = [o for o in action.option_strings if o.startswith("--")]
            if action.choices and long and action.help != argparse.SUPPRESS:
                shown = re.search(re.escape(long[0]) + r" \{?([a-z,\\|]+)", rows[leaf[0]])
                if shown and "\\|" in shown.group(1):
                    assert set(shown.group(1).split("\\|")) == set(action.choices), (leaf, long[0], shown.group(1))
        real.setdefault(leaf[0], set()).update(flags)
    for command, flags in documented.items():
        unknown = sorted(flags - real.get(command, set()))
        assert not unknown, f"docs/commands.md lists {unknown} that `localspec {command}` does not take"
