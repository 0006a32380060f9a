"""`localspec generate`: one prompt, streamed to the terminal, then a one-line stats summary.

With a `localspec serve` running on this machine it attaches to it (no second copy of the models);
--local loads them in this process instead.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from localspec.cli.attaching import LOCAL_HELP, attach_or_local
from localspec.cli.options import MODES, add_lora_argument, checked_flags, utf8_text
from localspec.cli.output import printable

if TYPE_CHECKING:  # the engine (numpy, pydantic) loads only when a prompt runs, not for every command
    from collections.abc import Iterator
    from pathlib import Path

    from localspec.attach.probe import Server
    from localspec.engine.config import GenerationRequest
    from localspec.engine.events import Done, Event, Token
    from localspec.models.adapters import LoraSpec

# --show-draft: accepted drafts green, accepted prediction tokens blue (the chat app's Ctrl+T colours).
ORIGIN_COLOURS = {"draft": "\x1b[32m", "prediction": "\x1b[34m"}
_RESET = "\x1b[0m"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text for one prompt", description=__doc__)
    p.add_argument("prompt", help="the prompt text ('-' reads standard input)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt as a user message in the model's chat template")
    p.add_argument("--system", help="system prompt (with --chat)")
    p.add_argument("--mode", choices=MODES,
                   help="speculation: auto (picks per step), off, draft (draft model) or lookup (prompt lookup); "
                        "default: attached, the server's; else settings.toml's [engine] mode, else auto")
    p.add_argument("-k", "--draft-k", type=int, dest="k", help="most tokens drafted per step")
    p.add_argument("--max-tokens", type=int, default=256)
    # Unset sampling flags leave the model's own settings (its registry entry), else the defaults.
    p.add_argument("--temperature", type=float, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, help="0 = off (default)")
    p.add_argument("--top-p", type=float, help="default 1.0")
    p.add_argument("--min-p", type=float, help="default 0.0")
    p.add_argument("--repeat-penalty", type=float, help="1.0 = off (default)")
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--think", action=argparse.BooleanOptionalAction,
                   help="with --chat: a thinking model's thought on or off (its template's enable_thinking, "
                        "as Qwen3's reads it); default: the template's own")
    p.add_argument("--profile", help="model profile from models.toml (default: settings.toml's profile, else the "
                                          "registry's default)")
    p.add_argument("--model", help="target model id, overriding the profile's")
    p.add_argument("--draft-model", help="draft model id, overriding the profile's")
    add_lora_argument(p)
    p.add_argument("--n-ctx", type=int, help="context tokens")
    p.add_argument("--threads", type=int, help="llama.cpp threads")
    p.add_argument("--no-pull", action="store_true", help="fail instead of fetching missing models")
    p.add_argument("--show-draft", action="store_true",
                   help="colour accepted tokens: green from a drafter, blue from a prediction")
    p.add_argument("--json", action="store_true", help="print the text, finish reason and stats as one JSON object")
    p.add_argument("--local", action="store_true", help=LOCAL_HELP)
    p.add_argument("--keep-alive", metavar="DURATION",
                   help="attached: how long the server keeps the models loaded after this request "
                        "(5m, 30s, 0 = unload now, -1 = always; default: the server's)")
    p.set_defaults(func=run)


def _blockers(args: argparse.Namespace) -> list[str]:
    """Flags only an engine of this process honours (a server has its own engine and sampler)."""
    out = [f"{flag} sets up an engine of its own" for flag, value in
           (("--n-ctx", args.n_ctx), ("--threads", args.threads), ("--draft-model", args.draft_model),
            ("--lora", args.lora))
           if value is not None]
    out += [f"{flag} is not part of the OpenAI API" for flag, value, default in
            (("--top-k", args.top_k, 0), ("--min-p", args.min_p, 0.0), ("--repeat-penalty", args.repeat_penalty, 1.0))
            if value is not None and value != default]
    return out


def shown(token: Token, *, colour: bool) -> str:
    """A token's text as printed: with `colour`, an accepted draft or prediction token in its colour."""
    code = ORIGIN_COLOURS.get(token.origin) if colour and token.text else None
    return f"{code}{token.text}{_RESET}" if code else token.text


def _request(args: argparse.Namespace) -> GenerationRequest:
    from localspec.engine.config import GenerationRequest
    from localspec.engine.sampling import SamplingParams

    prompt = utf8_text(sys.stdin.read() if args.prompt == "-" else args.prompt, "The prompt")
    for text, what in ((args.system, "--system"), *((stop, "--stop") for stop in args.stop)):
        utf8_text(text or "", what)
    with checked_flags("generate"):
        given = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                     repeat_penalty=args.repeat_penalty, seed=args.seed)
        sampling = SamplingParams(**{k: v for k, v in given.items() if v is not None})
        if args.chat:
            messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
                {"role": "user", "content": prompt}
            ]
            return GenerationRequest(
                messages=messages, max_tokens=args.max_tokens, sampling=sampling, stop=args.stop,
                mode=args.mode, k=args.k,
                template_vars=None if args.think is None else {"enable_thinking": args.think},
            )
        if args.think is not None:
            from localspec.errors import UsageError

            raise UsageError("--think and --no-think go with --chat: a raw prompt has no chat template.",
                             "Add --chat, or leave the flag out.")
        return GenerationRequest(
            prompt=prompt, max_tokens=args.max_tokens, sampling=sampling, stop=args.stop, mode=args.mode, k=args.k
        )


def _check_keep_alive(value: str | None) -> None:
    """--keep-alive read as the server reads it, so that a typo is refused here, before any model loads,
    not passed on (or, with --local, dropped without a word)."""
    if value is None:
        return
    from localspec.errors import UsageError
    from localspec.server.keepalive import parse_keep_alive

    try:
        parse_keep_alive(value)
    except ValueError as exc:
        raise UsageError(f"Invalid --keep-alive: {exc}.", "See `localspec generate --help`.") from None


def _peak_rss_mb() -> float:
    """This process's peak RSS. Linux's VmHWM belongs to the address space, which exec replaces;
    ru_maxrss survives exec, so a process started by a big parent would report the parent's peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run(args: argparse.Namespace) -> int:
    from localspec.settings import checked_active_profile

    args.profile = checked_active_profile(args.profile)  # the one active profile every face honours
    request = _request(args)
    _check_keep_alive(args.keep_alive)
    lora = None
    if args.lora is not None:  # a malformed flag fails before any server is probed or model loaded
        from localspec.models.adapters import parse_lora_spec

        lora = parse_lora_spec(args.lora)
    t0 = time.perf_counter()
    server = attach_or_local(model=args.model, profile=args.profile, local=args.local, blockers=_blockers(args))
    if server is not None:
        return _run_attached(args, request, server, t0)
    return _run_local(args, request, lora)


def _run_attached(args: argparse.Namespace, request: GenerationRequest, server: Server, t0: float) -> int:
    """The server's engine answers; this process streams and reports as if it had (no model loaded).
    The server logs the request in the shared metrics (face "api"): logging it here too would count it twice."""
    from localspec.attach.remote import RemoteGeneration, api_base, openai_client

    client = openai_client(api_base(server.url), api_key=server.key, timeout_s=3600)
    model = args.model or server.target or min(server.names)
    load_s = time.perf_counter() - t0
    gen = RemoteGeneration(client, model, request, localspec=True, keep_alive=args.keep_alive)
    try:
        done = _stream(args, iter(gen))
    finally:
        client.close()
    return _report(args, done, load_s, attached=server.url)


def _stream(args: argparse.Namespace, events: Iterator[Event]) -> Done:
    from localspec.engine.events import Done, Token

    terminal = sys.stdout.isatty()
    colour = args.show_draft and terminal
    done: Done | None = None
    for event in events:
        if isinstance(event, Token) and not args.json:
            if terminal:  # a model's (or a server's) escape sequences are text, not commands to the terminal
                event = replace(event, text=printable(event.text))
            sys.stdout.write(shown(event, colour=colour))
            sys.stdout.flush()
        elif isinstance(event, Done):
            done = event
    assert done is not None
    return done


def _run_local(args: argparse.Namespace, request: GenerationRequest, lora: LoraSpec | None) -> int:
    from localspec.service import open_engine  # heavy import (llama.cpp) only for this verb

    if not args.no_pull:
        from localspec.cli.models_cmd import ensure_models

        ensure_models(args.profile, [args.model, args.draft_model] if args.model else None)
    from localspec.cli.load_progress import LoadProgressDisplay

    t0 = time.perf_counter()
    with LoadProgressDisplay(sys.stderr) as show_progress:  # stderr only: --json keeps stdout clean
        engine = open_engine(
            profile=args.profile, target=args.model, draft=args.draft_model,
            mode=args.mode, n_ctx=args.n_ctx, n_threads=args.threads, on_progress=show_progress,
            lora_path=str(lora.path) if lora else None, lora_scale=lora.scale if lora else None,
        )
    load_s = time.perf_counter() - t0
    t_gen = time.perf_counter()
    draft_file = engine.draft.path if engine.draft is not None else None
    try:
        done = _stream(args, iter(engine.generate(request)))
    finally:
        engine.close()
    e2e_ms = (time.perf_counter() - t_gen) * 1000
    code = _report(args, done, load_s)
    # After the answer's closing newline and the stats line: a warning here reads as a line of its own.
    _log_metrics(args, request, done, e2e_ms, draft_file is not None, draft_file)
    return code


def _report(args: argparse.Namespace, done: Done, load_s: float, attached: str | None = None) -> int:
    """The JSON record or the summary line; `attached`: the server that answered."""
    out = sys.stdout
    s = done.stats
    peak_rss_mb = _peak_rss_mb()
    if args.json:
        record = {
            "text": done.text,
            "finish_reason": done.finish_reason,
            "stats": s.to_dict(),
            "load_s": round(load_s, 3),
            "peak_rss_mb": round(peak_rss_mb, 1),
            "attached": attached,
        }
        print(json.dumps(record, ensure_ascii=False))
    else:
        out.write("\n")
        summary = (
            f"[{s.mode}] {s.completion_tokens} tokens, {s.tokens_per_second:.1f} tok/s, "
            f"TTFT {s.ttft_ms:.0f} ms, prompt {s.prompt_tokens} (reused {s.reused_prefix_tokens})"
        )
        if s.drafted:
            summary += (
                f", accepted {s.accepted}/{s.drafted} ({s.acceptance_rate:.0%}), "
                f"{s.mean_accepted_length:.2f} tokens/pass"
            )
        summary += f", finish={done.finish_reason}, peak RSS {peak_rss_mb:.0f} MB"
        if attached:
            summary += f", attached to {attached}"
        if s.auto_steps:
            summary += f"\n{s.auto_summary()}"
        print(summary, file=sys.stderr)
    if done.finish_reason == "error":
        print(f"error: {done.error}", file=sys.stderr)
        return 1
    return 0


def _log_metrics(args: argparse.Namespace, request: GenerationRequest, done: Done, e2e_ms: float,
                 draft_loaded: bool, draft_file: Path | None = None) -> None:
    """Log the run with face "cli"; a metrics failure is reported, never fatal to generation."""
    try:
        from localspec.metrics import Metrics, RequestRecord
        from localspec.models import ModelManager

        mm = ModelManager()
        prof = mm.profile(args.profile)
        def model_id(name: str) -> str:  # imported models live in the store only, not the registry
            return mm.resolve(name).id if name in mm.registry else name

        target = model_id(args.model or prof.target)
        # The draft that was loaded: a target named with --model may have been paired with another.
        paired = next((m.model_id for m in mm.store.manifests()
                       if draft_file is not None and mm.installed_path(m.model_id) == draft_file), None)
        draft_id = args.draft_model or paired or prof.draft
        used_draft = draft_loaded and done.stats.mode in ("draft", "auto")
        draft = model_id(draft_id) if draft_id and used_draft else None
        hashes = {}
        for role, mid in (("target", target), ("draft", draft)):
            manifest = mm.manifest(mid) if mid else None
            if manifest and manifest.files:
                hashes[role] = manifest.files[0].sha256
        with Metrics.from_settings() as metrics:
            metrics.record(RequestRecord.from_stats(
                done.stats, face="cli", profile=args.profile or mm.registry.default_profile, target_model=target,
                draft_model=draft, finish_reason=done.finish_reason, e2e_ms=e2e_ms,
                error_class=done.error.split(":", 1)[0] if done.error else None,
                prompt_text=request.prompt if request.prompt is not None else json.dumps(
                    [m.model_dump(exclude_none=True) for m in request.messages or []], ensure_ascii=False),
                model_hashes=hashes,
            ))
    except Exception as exc:  # the answer is already out; losing its log line must not fail the run
        print(f"warning: request not logged to metrics: {exc}", file=sys.stderr)
