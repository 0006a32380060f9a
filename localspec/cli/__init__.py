"""The `localspec` command line: one module per verb group, each adding its own sub-parser."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from localspec import __version__
from localspec.errors import LocalspecError

# Each module exposes `register(subparsers)`, which adds its verbs and sets `func` on them.
_COMMAND_MODULES = (
    "localspec.cli.models_cmd",
    "localspec.cli.generate_cmd",
    "localspec.cli.chat_cmd",
    "localspec.cli.stats_cmd",
    "localspec.cli.serve_cmd",
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
    )
    parser.add_argument("--version", action="version", version=f"localspec {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug output to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    import importlib

    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        args = parser.parse_args([*(sys.argv[1:] if argv is None else argv), "chat"])  # no verb: the chat app
    try:
        return int(args.func(args) or 0)
    except LocalspecError as exc:
        print(f"error: {exc.cause}", file=sys.stderr)
        if exc.fix:
            print(f"  fix: {exc.fix}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
