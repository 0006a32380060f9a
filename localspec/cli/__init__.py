# PYTHON_ARGCOMPLETE_OK  (argcomplete's global completion looks for this marker in the first 1 KB)
"""The `localspec` command line: one module per verb group, each adding its own sub-parser.

Exit status: 0 success, 1 a runtime failure (a LocalspecError: cause and fix on stderr), 2 a usage
error (argparse's, or a UsageError), 130 interrupted, 141 the reader of standard output went away.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from localspec import __version__
from localspec.cli.output import EXIT_PIPE_CLOSED, printable, silence_stdout, stdout_reader_gone
from localspec.cli.parsing import attach_completers, show_defaults
from localspec.errors import LocalspecError, UsageError

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

# Each module exposes `register(subparsers)`, which adds its verbs and sets `func` on them.
_COMMAND_MODULES = (
    "localspec.cli.models_cmd",
    "localspec.cli.profiles_cmd",
    "localspec.cli.generate_cmd",
    "localspec.cli.edit_cmd",
    "localspec.cli.chat_cmd",
    "localspec.cli.stats_cmd",
    "localspec.cli.serve_cmd",
    "localspec.cli.ps_cmd",
    "localspec.cli.bench_cmd",
    "localspec.cli.doctor_cmd",
    "localspec.cli.service_cmd",
    "localspec.cli.cache_cmd",
    "localspec.cli.router_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="localspec",
        description="Fast local LLM inference with lossless speculative decoding.",
        epilog="Exit status: 0 success, 1 failure, 2 usage error. Shell completion: "
               'eval "$(register-python-argcomplete localspec)"',
    )
    parser.add_argument("--version", action="version", version=f"localspec {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug output to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    show_defaults(parser)
    return parser


def _complete(parser: argparse.ArgumentParser) -> None:
    """Answer a shell's tab completion request (argcomplete) and exit; a no-op otherwise."""
    if "_ARGCOMPLETE" not in os.environ:
        return
    try:
        import argcomplete
    except ImportError:
        return
    attach_completers(parser)
    argcomplete.autocomplete(parser)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    _complete(parser)
    try:
        return _run(parser, argv)
    except BrokenPipeError:
        if not stdout_reader_gone():
            raise  # a socket or a child's pipe, not our output: a real failure
        silence_stdout()
        return EXIT_PIPE_CLOSED


def _run(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    # huggingface-hub prints its records through a handler of its own (HF_HUB_VERBOSITY sets its level);
    # passed on to ours as well, each retry warning would show twice among the progress lines.
    logging.getLogger("huggingface_hub").propagate = False
    if not getattr(args, "func", None):
        args = parser.parse_args([*(sys.argv[1:] if argv is None else argv), "chat"])  # no verb: the chat app
    try:
        code = int(args.func(args) or 0)
    except LocalspecError as exc:
        sys.stdout.flush()  # what the verb printed before failing comes first
        # Causes quote names (files, model ids, registry text) that may hold escape sequences.
        print(f"error: {printable(exc.cause)}", file=sys.stderr)
        if exc.fix:
            print(f"  fix: {printable(exc.fix)}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, UsageError) else EXIT_FAILURE
    except KeyboardInterrupt as exc:  # a verb may note what the interruption left (a pull: what it kept)
        print("; ".join(["interrupted", *getattr(exc, "__notes__", ())]), file=sys.stderr)
        return EXIT_INTERRUPTED
    sys.stdout.flush()  # a closed pipe shows here, inside main, not at the interpreter's exit
    return code
