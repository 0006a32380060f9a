"""`localspec chat` (also plain `localspec`): the terminal chat app.

By default the models run in this process; `--connect URL` attaches to a running
`localspec serve` (or any OpenAI-compatible endpoint) so they are not loaded twice.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from localspec.cli.options import MODES, add_cache_judge_arguments

if TYPE_CHECKING:
    from localspec.engine.events import ProgressFn
    from localspec.tui.backend import Backend


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="open the terminal chat app (the default command)", description=__doc__)
    add_arguments(p)
    p.set_defaults(func=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--connect", metavar="URL", help="use an OpenAI-compatible server instead of loading models")
    p.add_argument("--api-key", help="API key for --connect (default: none needed)")
    p.add_argument("--model", help="with --connect: the server's model name (default: the first it lists)")
    p.add_argument("--profile", help="model profile from models.toml (default: the active one)")
    p.add_argument("--mode", choices=MODES, help="speculation mode for in-process models")
    p.add_argument("--n-ctx", type=int, help="context tokens")
    p.add_argument("--threads", type=int, help="llama.cpp threads")
    p.add_argument("--cache-semantic", action="store_true",
                   help="also answer near-duplicate prompts from the cache (off by default; see the README)")
    add_cache_judge_arguments(p)


def run(args: argparse.Namespace) -> int:
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        from localspec.cli import build_parser

        build_parser().print_help()
        return 0
    from localspec.tui.logsetup import route_logs_to_file

    log = route_logs_to_file()
    app = make_app(args)
    app.run()
    if app.return_code:
        print(f"localspec: the chat app stopped with an error; see {log}", file=sys.stderr)
    return int(app.return_code or 0)


def make_app(args: argparse.Namespace):
    from localspec.tui import ChatApp

    connect = getattr(args, "connect", None)
    if connect:
        from localspec.tui import RemoteBackend

        def factory(profile: str | None, *, on_progress: ProgressFn) -> Backend:  # loads nothing: no progress
            return RemoteBackend(connect, model=args.model, api_key=args.api_key)
    else:
        from localspec.tui import LocalBackend

        def factory(profile: str | None, *, on_progress: ProgressFn) -> Backend:
            return LocalBackend.open(profile, mode=args.mode, n_ctx=args.n_ctx, n_threads=args.threads,
                                     cache_semantic=getattr(args, "cache_semantic", False),
                                     cache_judge=getattr(args, "cache_judge", "model"), on_progress=on_progress)

    from localspec.metrics import Metrics
    from localspec.tui import SessionMetrics

    # The same log `localspec serve` writes: the pane and `localspec stats` see the same records.
    return ChatApp(factory, profile=getattr(args, "profile", None), metrics=SessionMetrics(Metrics.from_settings()))
