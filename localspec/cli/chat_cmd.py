"""`localspec chat` (also plain `localspec`): the terminal chat app.

A `localspec serve` running on this machine is found and attached to (its models are not loaded
twice); `--connect URL` names a server (any OpenAI-compatible endpoint); `--local` loads the models
in this process.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from localspec.cli.attaching import LOCAL_HELP, attach_or_local
from localspec.cli.options import MODES, add_cache_judge_arguments, add_lora_argument

if TYPE_CHECKING:
    from localspec.attach.probe import Server
    from localspec.engine.events import ProgressFn
    from localspec.models.adapters import LoraSpec
    from localspec.settings import CacheTable
    from localspec.tui.backend import Backend

logger = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="open the terminal chat app (the default command)", description=__doc__)
    add_arguments(p)
    p.set_defaults(func=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--connect", metavar="URL", help="use an OpenAI-compatible server instead of loading models")
    p.add_argument("--api-key", help="API key for --connect or the local server (default: $LOCALSPEC_API_KEY, "
                                     "else the server's key file)")
    p.add_argument("--local", action="store_true", help=LOCAL_HELP)
    p.add_argument("--model", help="with --connect: the server's model name (default: the first it lists)")
    p.add_argument("--profile", help="model profile from models.toml (default: the active one)")
    p.add_argument("--mode", choices=MODES, help="speculation mode for in-process models")
    add_lora_argument(p)
    p.add_argument("--n-ctx", type=int, help="context tokens")
    p.add_argument("--threads", type=int, help="llama.cpp threads")
    # Unset cache flags take the settings' [cache] table, as `serve` does (one cache-settings object).
    p.add_argument("--no-cache", action="store_true", default=None, help="never answer from the cache")
    p.add_argument("--cache-semantic", action="store_true", default=None,
                   help="also answer near-duplicate prompts from the cache (default: [cache] semantic, off)")
    add_cache_judge_arguments(p, default=None)


def run(args: argparse.Namespace) -> int:
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        from localspec.cli import build_parser

        build_parser().print_help()
        return 0
    from localspec.tui.logsetup import route_logs_to_file

    from localspec.settings import active_profile

    args.profile = active_profile(args.profile)  # the one active profile every face honours
    log = route_logs_to_file()
    chat_lora(args)  # a malformed --lora (or one with --connect) fails before the screen opens
    # Found before the app takes the screen, so that why a server is not used shows on stderr.
    first = None if args.connect else attach_or_local(model=None, profile=args.profile, api_key=args.api_key,
                                                      local=args.local, blockers=_blockers(args))
    app = make_app(args, attached={args.profile: first})
    app.run()
    if app.return_code:
        print(f"localspec: the chat app stopped with an error; see {log}", file=sys.stderr)
    return int(app.return_code or 0)


def _blockers(args: argparse.Namespace) -> list[str]:
    """Why this chat needs models of its own rather than a running server's."""
    return ["--lora sets up an engine of its own"] if getattr(args, "lora", None) else []


def chat_lora(args: argparse.Namespace) -> LoraSpec | None:
    """The adapter --lora names (None without it); refused with --connect, whose server has its own
    models."""
    text = getattr(args, "lora", None)
    if text is None:
        return None
    from localspec.errors import UsageError
    from localspec.models.adapters import parse_lora_spec

    if getattr(args, "connect", None):
        raise UsageError("--lora applies an adapter to models loaded here; --connect uses a server's models.",
                         "Drop --connect (or start that server with --lora).")
    return parse_lora_spec(text)


def make_app(args: argparse.Namespace, attached: dict[str | None, Server | None] | None = None):
    """The app; `attached`: what was decided already for a profile (a server, or None: in-process)."""
    from localspec.tui import ChatApp

    connect = getattr(args, "connect", None)
    decided = dict(attached or {})
    if connect:
        from localspec.tui import RemoteBackend

        def factory(profile: str | None, *, on_progress: ProgressFn) -> Backend:  # loads nothing: no progress
            return RemoteBackend(connect, model=args.model, api_key=args.api_key)
    else:
        from localspec.tui import LocalBackend, RemoteBackend

        def factory(profile: str | None, *, on_progress: ProgressFn) -> Backend:
            # Decided again for another profile chosen in the app (is it the server's?), and when the
            # server found before no longer answers as localspec (stopped, or another program there).
            if profile not in decided or (decided[profile] is not None and not _answers(decided[profile])):
                decided[profile] = attach_or_local(model=None, profile=profile, api_key=getattr(args, "api_key", None),
                                                   local=getattr(args, "local", False), say=logger.warning,
                                                   blockers=_blockers(args))
            server = decided[profile]
            if server is not None:
                return RemoteBackend(server.url, model=server.target or min(server.names), api_key=server.key,
                                     localspec=True, profile=server.profile, attached=True)
            lora = chat_lora(args)
            return LocalBackend.open(profile, mode=args.mode, n_ctx=args.n_ctx, n_threads=args.threads,
                                     cache=chat_cache(args), on_progress=on_progress,
                                     lora_path=str(lora.path) if lora else None,
                                     lora_scale=lora.scale if lora else None)

    from localspec.metrics import Metrics
    from localspec.tui import SessionMetrics

    from localspec.settings import active_profile

    profile = None if connect else active_profile(getattr(args, "profile", None))
    # The same log `localspec serve` writes: the pane and `localspec stats` see the same records.
    return ChatApp(factory, profile=profile, metrics=SessionMetrics(Metrics.from_settings()))


def chat_cache(args: argparse.Namespace) -> CacheTable:
    """The in-process chat's cache: the settings' [cache] table under this command's flags."""
    from localspec.settings import load_settings

    table = load_settings().cache
    flags = {"enabled": False if getattr(args, "no_cache", None) else None,
             "semantic": getattr(args, "cache_semantic", None), "judge": getattr(args, "cache_judge", None)}
    return table.model_copy(update={k: v for k, v in flags.items() if v is not None})


def _answers(server: Server | None) -> bool:
    from localspec.attach.probe import health

    return server is not None and health(server.url) is not None
