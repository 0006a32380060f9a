"""`localspec edit FILE "instruction"`: the model rewrites the file, with the file itself as the
prediction (Predicted Outputs), so every unchanged line costs a verify pass instead of a step each.
Shows the reply as it streams, a unified diff and the speed-up; --write replaces the file. With a
`localspec serve` running on this machine it edits through it (no second copy of the models)."""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from localspec.cli.attaching import LOCAL_HELP, attach_or_local
from localspec.cli.options import MODES, checked_flags, utf8_text
from localspec.cli.output import printable

if TYPE_CHECKING:  # the engine (numpy, llama.cpp) loads only when an edit runs
    from collections.abc import Iterable

    from localspec.edit.task import EditTask
    from localspec.engine.config import GenerationRequest
    from localspec.engine.events import Done, Event
    from localspec.engine.sampling import SamplingParams

_COLOURS = {"+": "\x1b[32m", "-": "\x1b[31m", "@": "\x1b[36m"}
# Control characters a model's (or a server's) text must not send to a terminal: escape sequences
# could move the cursor, retitle the window or hide what the diff says. Tab and newline stay.
# Attached to a server, an edit gets the server's context and token cap (4,096 by default): a file
# past this many bytes (about 2,000 tokens, whose reply doubles it) is edited by models loaded here.
ATTACH_MAX_BYTES = 6_000
_ACCEPTED = "\x1b[32m"
_RESET = "\x1b[0m"
# Tokens of the chat template around the two messages, beyond what tokenizing their text counts.
TEMPLATE_SLACK = 64
# Room for the reply beyond the file's own tokens: a fence, and an edit that adds lines.
REPLY_SLACK_MIN = 256
REPLY_GROWTH = 0.25


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("edit", help="edit a file with the model (the file is the prediction)", description=__doc__)
    p.add_argument("file", help="the text file to edit")
    p.add_argument("instruction", help="what to change, e.g. 'rename fetch to fetch_page'")
    p.add_argument("--write", action="store_true",
                   help="replace the file (atomically; the old one is kept as FILE.bak)")
    p.add_argument("--json", action="store_true", help="print the new text, the diff and the stats as one JSON object")
    p.add_argument("--connect", metavar="URL", help="edit through a running OpenAI-compatible server instead of "
                   "loading models (e.g. http://127.0.0.1:8000)")
    p.add_argument("--api-key", help="with --connect: the server's API key (default: $OPENAI_API_KEY)")
    p.add_argument("--mode", choices=MODES, default="auto", help="speculation (default auto; off ignores the "
                   "prediction)")
    p.add_argument("--no-prediction", action="store_true", help="send no prediction (to compare the speed)")
    p.add_argument("--max-tokens", type=int, help="most reply tokens (default: the file's tokens plus a quarter)")
    p.add_argument("--temperature", type=float, default=0.0, help="0.0 = greedy (default)")
    p.add_argument("--seed", type=int)
    p.add_argument("--profile", help="model profile from models.toml (default: settings.toml's profile, else the "
                                     "registry's default)")
    p.add_argument("--model", help="target model id (with --connect: the model name to ask the server for)")
    p.add_argument("--draft-model", help="draft model id, overriding the profile's")
    p.add_argument("--threads", type=int, help="llama.cpp threads")
    p.add_argument("--no-pull", action="store_true", help="fail instead of fetching missing models")
    p.add_argument("--local", action="store_true", help=LOCAL_HELP)
    p.add_argument("--allow-shrink", action="store_true",
                   help="take a reply under half the file's length as the whole file (e.g. 'delete the tests')")
    p.set_defaults(func=run)


@dataclass(frozen=True)
class EditOutcome:
    """What came back for the edit, from whichever engine answered."""

    reply: str
    finish_reason: str
    max_tokens: int
    mode: str
    completion_tokens: int
    accepted: int  # drafted tokens the output kept, prediction's included
    prediction_accepted: int | None  # None: no prediction was sent
    prediction_rejected: int | None
    decode_s: float
    speedup: float | None  # against plain decoding, estimated from this machine's cost of one pass
    error: str | None = None
    opens_thought: bool = False  # the prompt opened a thinking model's thought: the reply holds its </think>

    @property
    def target_passes(self) -> int:
        """Every pass emits one token of the target's own plus the drafted tokens it accepted."""
        return max(1, self.completion_tokens - self.accepted)

    @property
    def tokens_per_pass(self) -> float:
        return self.completion_tokens / self.target_passes


@dataclass(frozen=True)
class ContextNeed:
    prompt_tokens: int
    file_tokens: int
    reply_tokens: int  # the max_tokens the request gets
    trained: int

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.reply_tokens


def reply_budget(file_tokens: int, requested: int | None) -> int:
    return requested or file_tokens + max(REPLY_SLACK_MIN, int(file_tokens * REPLY_GROWTH))


def context_need(task: EditTask, target: Path, requested: int | None) -> ContextNeed:
    """Tokens the edit needs: the prompt (file, instruction, template) and a reply as long as the
    file plus room to grow. Counted with the model's own tokenizer, before the model loads."""
    from localspec.engine.runtime import Vocabulary

    with Vocabulary(target) as vocab:
        file_tokens = len(vocab.tokenize(task.text))
        prompt = sum(len(vocab.tokenize(m.content)) for m in task.messages()) + TEMPLATE_SLACK
        return ContextNeed(prompt_tokens=prompt, file_tokens=file_tokens,
                           reply_tokens=reply_budget(file_tokens, requested), trained=vocab.n_ctx_train)


def check_fits(need: ContextNeed, task: EditTask, model: str) -> None:
    from localspec.errors import UsageError

    if need.total > need.trained:
        raise UsageError(
            f"{task.name} is {need.file_tokens:,} tokens: the edit needs about {need.total:,} tokens of context "
            f"(prompt {need.prompt_tokens:,} + reply {need.reply_tokens:,}) and {model} was trained on "
            f"{need.trained:,}.",
            "Edit a smaller file, or a part of this one.",
        )


def _round_up(n: int, step: int = 256) -> int:
    return -(-n // step) * step


def edit_sampling(args: argparse.Namespace) -> SamplingParams:
    """--temperature and --seed, checked as `generate` checks them (a bad value is a usage error)."""
    from localspec.engine.sampling import SamplingParams

    with checked_flags("edit"):
        return SamplingParams(temperature=args.temperature, seed=args.seed)


def edit_request(args: argparse.Namespace, task: EditTask, max_tokens: int) -> GenerationRequest:
    from localspec.engine.config import GenerationRequest

    return GenerationRequest(
        messages=task.messages(), max_tokens=max_tokens, mode=args.mode, sampling=edit_sampling(args),
        prediction=None if args.no_prediction or not task.text else task.prediction(),
    )


def _stream(events: Iterable[Event], stream: TextIO | None) -> Done:
    from localspec.engine.events import Done, Token

    for event in events:
        if isinstance(event, Token):
            _show(stream, event.text, accepted=event.origin not in ("target", "cache"))
        elif isinstance(event, Done):
            return event
    raise AssertionError("a generation ends with Done")


def edit_locally(args: argparse.Namespace, task: EditTask, stream: TextIO | None) -> EditOutcome:
    from localspec.service import open_engine, resolve_models

    if not args.no_pull:
        from localspec.cli.models_cmd import ensure_models

        ensure_models(args.profile, [args.model, args.draft_model] if args.model else None)
    files, profile_ctx = resolve_models(args.profile, args.model, args.draft_model, need_draft=False)
    need = context_need(task, files.target, args.max_tokens)
    check_fits(need, task, files.target_id)
    n_ctx = min(need.trained, max(profile_ctx or 0, _round_up(need.total)))
    request = edit_request(args, task, need.reply_tokens)
    from localspec.cli.load_progress import LoadProgressDisplay

    with LoadProgressDisplay(sys.stderr) as show_progress:
        engine = open_engine(profile=args.profile, target=args.model, draft=args.draft_model, mode=args.mode,
                             n_ctx=n_ctx, n_threads=args.threads, on_progress=show_progress)
    draft_loaded, t0 = engine.draft is not None, time.perf_counter()
    try:
        opened = engine.prompter.opens_thought_with(engine.with_defaults(request).template_vars)
        done = _stream(engine.generate(request), stream)
        costs = engine.costs
    finally:
        engine.close()
    from localspec.cli.generate_cmd import _log_metrics

    _log_metrics(args, request, done, (time.perf_counter() - t0) * 1000, draft_loaded)
    s = done.stats
    speedup = None
    if costs is not None and s.decode_ms > 0 and s.completion_tokens > 1:
        # Plain decoding would have paid one single-row pass per token at this context length.
        plain = (s.completion_tokens - 1) * costs.verify_cost(1, s.prompt_tokens + s.completion_tokens // 2)
        speedup = plain / (s.decode_ms / 1000)
    return _outcome(done, need.reply_tokens, predicted=request.prediction is not None, speedup=speedup,
                    opens_thought=opened)


def _outcome(done: Done, max_tokens: int, *, predicted: bool, speedup: float | None,
             opens_thought: bool = False) -> EditOutcome:
    s = done.stats
    return EditOutcome(opens_thought=opens_thought,
        reply=done.text, finish_reason=done.finish_reason, max_tokens=max_tokens, mode=s.mode,
        completion_tokens=s.completion_tokens, accepted=s.accepted,
        prediction_accepted=s.prediction_accepted if predicted else None,
        prediction_rejected=s.prediction_rejected if predicted else None, decode_s=s.decode_ms / 1000,
        speedup=speedup, error=done.error,
    )


def edit_remotely(args: argparse.Namespace, task: EditTask, stream: TextIO | None, *, url: str,
                  key: str | None, model: str | None, localspec: bool) -> EditOutcome:
    """The same edit through a server's /v1/chat/completions, with `prediction` as OpenAI defines it
    (a localspec server also sends each token's origin and its stats)."""
    import openai

    from localspec.attach.remote import RemoteGeneration, api_base, openai_client
    from localspec.errors import LocalspecError

    # No tokenizer here: UTF-8 code runs 3-4 bytes per token, so a byte count halved bounds the reply.
    request = edit_request(args, task, reply_budget(len(task.text.encode()) // 2, args.max_tokens))
    client = openai_client(api_base(url), api_key=key or os.environ.get("OPENAI_API_KEY"), timeout_s=3600)
    try:
        model = model or next(iter(client.models.list())).id
        done = _stream(RemoteGeneration(client, model, request, localspec=localspec), stream)
    except openai.APIConnectionError as exc:
        raise LocalspecError(f"Could not reach a server at {url}/v1: {str(exc).rstrip('.')}.",  # openai's ends in one
                             "Start it with `localspec serve`, or check the --connect URL.") from None
    except StopIteration:
        raise LocalspecError(f"The server at {url} lists no models.", "Name one with --model.") from None
    finally:
        client.close()
    return _outcome(done, request.max_tokens, predicted=request.prediction is not None, speedup=None)


def _show(stream: TextIO | None, text: str, *, accepted: bool) -> None:
    if stream is None or not text:
        return
    text = printable(text)
    stream.write(f"{_ACCEPTED}{text}{_RESET}" if accepted else text)
    stream.flush()


def unified_diff(old: str, new: str, name: str) -> str:
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                 fromfile=f"a/{name}", tofile=f"b/{name}")
    # A last line without a newline would glue onto the next one; say so as diff(1) does.
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def coloured(diff: str) -> str:
    out = []
    for line in diff.splitlines(keepends=True):
        colour = None if line.startswith(("+++", "---")) else _COLOURS.get(line[:1])
        out.append(f"{colour}{line.rstrip(chr(10))}{_RESET}\n" if colour else line)
    return "".join(out)


def summary(o: EditOutcome) -> str:
    parts = [f"[{o.mode}] {o.completion_tokens} tokens in {o.target_passes} target passes "
             f"({o.tokens_per_pass:.1f} per pass)"]
    if o.decode_s > 0 and o.completion_tokens > 1:
        parts.append(f"{(o.completion_tokens - 1) / o.decode_s:.1f} tok/s")
    if o.prediction_accepted is not None:
        parts.append(f"prediction: {o.prediction_accepted} accepted, {o.prediction_rejected} rejected")
    if o.speedup is not None:
        parts.append(f"about {o.speedup:.1f}x plain decoding (from this machine's measured cost of one pass)")
    return ", ".join(parts)


def _edit(args: argparse.Namespace, task: EditTask, stream: TextIO | None) -> EditOutcome:
    """Through --connect's server, else a running `localspec serve`, else models loaded here."""
    if args.connect:
        from localspec.attach.probe import health

        url = args.connect.rstrip("/").removesuffix("/v1")
        return edit_remotely(args, task, stream, url=url, key=args.api_key, model=args.model,
                             localspec=health(url) is not None)
    blockers = [f"{flag} sets up an engine of its own" for flag, value in
                (("--threads", args.threads), ("--draft-model", args.draft_model)) if value is not None]
    size = len(task.text.encode())
    if size > ATTACH_MAX_BYTES:
        blockers.append(f"{task.name} is {size:,} bytes, more than a server's default context takes for an edit")
    server = attach_or_local(model=args.model, profile=args.profile, local=args.local, blockers=blockers)
    if server is not None:
        return edit_remotely(args, task, stream, url=server.url, key=server.key,
                             model=args.model or server.target or min(server.names), localspec=True)
    return edit_locally(args, task, stream)


def run(args: argparse.Namespace) -> int:
    from localspec.edit.files import read_source, write_with_backup
    from localspec.edit.reply import NotWholeFile, extract_file
    from localspec.edit.task import EditTask
    from localspec.engine.thoughts import answer_only
    from localspec.errors import UsageError

    utf8_text(args.instruction, "The instruction")
    if not args.instruction.strip():
        raise UsageError("The instruction is empty.",
                         'Say what to change, e.g. localspec edit app.py "add type hints".')
    if args.max_tokens is not None and args.max_tokens <= 0:
        raise UsageError("--max-tokens must be positive.", "Leave it out to size the reply from the file.")
    edit_sampling(args)  # a bad --temperature or --seed fails before the file is read or a model loads
    from localspec.settings import checked_active_profile

    args.profile = checked_active_profile(args.profile)  # settings.toml's profile, as every face (it was ignored)
    source = read_source(Path(args.file))
    task = EditTask(name=source.path.name, text=source.text, instruction=args.instruction)
    stream = sys.stderr if not args.json and sys.stderr.isatty() else None
    outcome = _edit(args, task, stream)
    if stream is not None:
        stream.write("\n")
    if outcome.error:
        print(f"error: {printable(outcome.error)}", file=sys.stderr)
        return 1
    refused, new_text = None, None
    try:
        # A thinking model's thought may draft code in fences of its own: the file is in the answer.
        answer = answer_only(outcome.reply, opened=outcome.opens_thought)
        new_text = extract_file(answer, original=source.text, finish_reason=outcome.finish_reason,
                                max_tokens=outcome.max_tokens, allow_shrink=args.allow_shrink)
    except NotWholeFile as exc:
        refused = str(exc)
    diff = unified_diff(source.text, new_text, task.name) if new_text is not None else ""
    backup, unwritten = None, None
    if args.write and new_text is not None and diff:
        try:
            backup = write_with_backup(source, new_text)
        except OSError as exc:  # a full disk, a read-only folder: the reply is still printed, then this
            unwritten = f"Cannot write {source.path}: {exc.strerror or exc}; it is unchanged"
    if args.json:
        print(json.dumps({
            "file": str(source.path), "changed": bool(diff), "text": new_text, "diff": diff, "refused": refused,
            "written": backup is not None, "backup": str(backup) if backup else None, "reply": outcome.reply,
            "stats": {**{k: v for k, v in asdict(outcome).items() if k != "reply"},
                      "target_passes": outcome.target_passes, "tokens_per_pass": round(outcome.tokens_per_pass, 3)},
        }, ensure_ascii=False))
        _unwritten(unwritten)
        return 1 if refused or unwritten else 0
    print(summary(outcome), file=sys.stderr)
    if refused:
        print(f"error: not written, the reply is not a whole file: {refused}.", file=sys.stderr)
        return 1
    if not diff:
        print(f"No changes to {source.path}.", file=sys.stderr)
        return 0
    sys.stdout.write(coloured(printable(diff)) if sys.stdout.isatty() else diff)
    if unwritten:
        _unwritten(unwritten)
        return 1
    if backup is not None:
        print(f"Wrote {source.path} (the old file is {backup}).", file=sys.stderr)
    else:
        print(f"Not written: add --write to replace {source.path} (a backup is kept).", file=sys.stderr)
    return 0


def _unwritten(cause: str | None) -> None:
    """The one error and fix lines of a --write that failed, after the reply was printed (nothing lost)."""
    if cause:
        sys.stdout.flush()
        print(f"error: {printable(cause)}.", file=sys.stderr)
        print("  fix: Free space or make the folder writable, then apply the diff above (or run the edit again).",
              file=sys.stderr)
