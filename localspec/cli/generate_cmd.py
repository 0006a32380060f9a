"""`localspec generate`: one prompt, streamed to the terminal, then a one-line stats summary."""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from typing import TYPE_CHECKING

from localspec.cli.options import MODES

if TYPE_CHECKING:  # the engine (numpy, pydantic) loads only when a prompt runs, not for every command
    from pathlib import Path

    from localspec.engine.config import GenerationRequest
    from localspec.engine.events import Done, Token

# --show-draft: accepted drafts green, accepted prediction tokens blue (the chat app's Ctrl+T colours).
ORIGIN_COLOURS = {"draft": "\x1b[32m", "prediction": "\x1b[34m"}
_RESET = "\x1b[0m"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text for one prompt", description=__doc__)
    p.add_argument("prompt", help="the prompt text ('-' reads standard input)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt as a user message in the model's chat template")
    p.add_argument("--system", help="system prompt (with --chat)")
    p.add_argument("--mode", choices=MODES, help="speculation: off, draft (draft model) or lookup (prompt lookup)")
    p.add_argument("-k", "--draft-k", type=int, dest="k", help="most tokens drafted per step")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--profile", help="model profile from models.toml (default: the registry's default)")
    p.add_argument("--model", help="target model id, overriding the profile's")
    p.add_argument("--draft-model", help="draft model id, overriding the profile's")
    p.add_argument("--n-ctx", type=int, help="context tokens")
    p.add_argument("--threads", type=int, help="llama.cpp threads")
    p.add_argument("--no-pull", action="store_true", help="fail instead of fetching missing models")
    p.add_argument("--show-draft", action="store_true",
                   help="colour accepted tokens: green from a drafter, blue from a prediction")
    p.add_argument("--json", action="store_true", help="print the text, finish reason and stats as one JSON object")
    p.set_defaults(func=run)


def shown(token: Token, *, colour: bool) -> str:
    """A token's text as printed: with `colour`, an accepted draft or prediction token in its colour."""
    code = ORIGIN_COLOURS.get(token.origin) if colour and token.text else None
    return f"{code}{token.text}{_RESET}" if code else token.text


def _request(args: argparse.Namespace) -> GenerationRequest:
    from pydantic import ValidationError

    from localspec.engine.config import GenerationRequest
    from localspec.engine.sampling import SamplingParams
    from localspec.errors import UsageError

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    try:
        sampling = SamplingParams(
            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
            repeat_penalty=args.repeat_penalty, seed=args.seed,
        )
        if args.chat:
            messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
                {"role": "user", "content": prompt}
            ]
            return GenerationRequest(
                messages=messages, max_tokens=args.max_tokens, sampling=sampling, stop=args.stop,
                mode=args.mode, k=args.k,
            )
        return GenerationRequest(
            prompt=prompt, max_tokens=args.max_tokens, sampling=sampling, stop=args.stop, mode=args.mode, k=args.k
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "request"
        raise UsageError(f"Invalid {field}: {err['msg']}.", "See `localspec generate --help`.") from exc


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
    from localspec.engine.events import Done, Token
    from localspec.service import open_engine  # heavy import (llama.cpp) only for this verb

    request = _request(args)
    if not args.no_pull:
        from localspec.cli.models_cmd import ensure_models

        ensure_models(args.profile, [args.model, args.draft_model] if args.model else None)
    from localspec.cli.load_progress import LoadProgressDisplay

    t0 = time.perf_counter()
    with LoadProgressDisplay(sys.stderr) as show_progress:  # stderr only: --json keeps stdout clean
        engine = open_engine(
            profile=args.profile, target=args.model, draft=args.draft_model,
            mode=args.mode, n_ctx=args.n_ctx, n_threads=args.threads, on_progress=show_progress,
        )
    load_s = time.perf_counter() - t0
    colour = args.show_draft and sys.stdout.isatty()
    out = sys.stdout
    done: Done | None = None
    t_gen = time.perf_counter()
    draft_file = engine.draft.path if engine.draft is not None else None
    try:
        for event in engine.generate(request):
            if isinstance(event, Token) and not args.json:
                out.write(shown(event, colour=colour))
                out.flush()
            elif isinstance(event, Done):
                done = event
    finally:
        engine.close()
    assert done is not None
    _log_metrics(args, request, done, (time.perf_counter() - t_gen) * 1000, draft_file is not None, draft_file)
    s = done.stats
    peak_rss_mb = _peak_rss_mb()
    if args.json:
        record = {
            "text": done.text,
            "finish_reason": done.finish_reason,
            "stats": s.to_dict(),
            "load_s": round(load_s, 3),
            "peak_rss_mb": round(peak_rss_mb, 1),
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
