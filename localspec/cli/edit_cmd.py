"""`localspec edit FILE "instruction"`: the model rewrites the file, with the file itself as the
prediction (Predicted Outputs), so every unchanged line costs a verify pass instead of a step each.
Shows the reply as it streams, a unified diff and the speed-up; --write replaces the file."""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from localspec.cli.options import MODES

if TYPE_CHECKING:  # the engine (numpy, llama.cpp) loads only when an edit runs
    from localspec.edit.task import EditTask
    from localspec.engine.events import Stats

_COLOURS = {"+": "\x1b[32m", "-": "\x1b[31m", "@": "\x1b[36m"}
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
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--seed", type=int)
    p.add_argument("--profile", help="model profile from models.toml (default: the registry's default)")
    p.add_argument("--model", help="target model id (with --connect: the model name to ask the server for)")
    p.add_argument("--draft-model", help="draft model id, overriding the profile's")
    p.add_argument("--threads", type=int, help="llama.cpp threads")
    p.add_argument("--no-pull", action="store_true", help="fail instead of fetching missing models")
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


def edit_locally(args: argparse.Namespace, task: EditTask, stream: TextIO | None) -> EditOutcome:
    from localspec.engine.config import GenerationRequest
    from localspec.engine.events import Done, Token
    from localspec.engine.sampling import SamplingParams
    from localspec.service import open_engine, resolve_models

    if not args.no_pull:
        from localspec.cli.models_cmd import ensure_models

        ensure_models(args.profile, [args.model, args.draft_model] if args.model else None)
    files, profile_ctx = resolve_models(args.profile, args.model, args.draft_model, need_draft=False)
    need = context_need(task, files.target, args.max_tokens)
    check_fits(need, task, files.target_id)
    n_ctx = min(need.trained, max(profile_ctx or 0, _round_up(need.total)))
    request = GenerationRequest(
        messages=task.messages(), max_tokens=need.reply_tokens, mode=args.mode,
        sampling=SamplingParams(temperature=args.temperature, seed=args.seed),
        prediction=None if args.no_prediction or not task.text else task.prediction(),
    )
    from localspec.cli.load_progress import LoadProgressDisplay

    with LoadProgressDisplay(sys.stderr) as show_progress:
        engine = open_engine(profile=args.profile, target=args.model, draft=args.draft_model, mode=args.mode,
                             n_ctx=n_ctx, n_threads=args.threads, on_progress=show_progress)
    done: Done | None = None
    draft_loaded, t0 = engine.draft is not None, time.perf_counter()
    try:
        for event in engine.generate(request):
            if isinstance(event, Token):
                _show(stream, event.text, accepted=event.origin not in ("target", "cache"))
            elif isinstance(event, Done):
                done = event
        costs = engine.costs
    finally:
        engine.close()
    assert done is not None
    from localspec.cli.generate_cmd import _log_metrics

    _log_metrics(args, request, done, (time.perf_counter() - t0) * 1000, draft_loaded)
    s = done.stats
    speedup = None
    if costs is not None and s.decode_ms > 0 and s.completion_tokens > 1:
        # Plain decoding would have paid one single-row pass per token at this context length.
        plain = (s.completion_tokens - 1) * costs.verify_cost(1, s.prompt_tokens + s.completion_tokens // 2)
        speedup = plain / (s.decode_ms / 1000)
    return _outcome(done.text, done.finish_reason, need.reply_tokens, s, request.prediction is not None,
                    speedup, done.error)


def _outcome(reply: str, finish: str, max_tokens: int, s: Stats, predicted: bool, speedup: float | None,
             error: str | None) -> EditOutcome:
    return EditOutcome(
        reply=reply, finish_reason=finish, max_tokens=max_tokens, mode=s.mode, completion_tokens=s.completion_tokens,
        accepted=s.accepted, prediction_accepted=s.prediction_accepted if predicted else None,
        prediction_rejected=s.prediction_rejected if predicted else None, decode_s=s.decode_ms / 1000,
        speedup=speedup, error=error,
    )


def edit_remotely(args: argparse.Namespace, task: EditTask, stream: TextIO | None) -> EditOutcome:
    """The same edit through a server's /v1/chat/completions, with `prediction` as OpenAI defines it."""
    import openai

    from localspec.errors import LocalspecError

    base = args.connect.rstrip("/")
    base = base if base.endswith("/v1") else base + "/v1"
    client = openai.OpenAI(base_url=base, api_key=args.api_key or os.environ.get("OPENAI_API_KEY") or "localspec",
                           max_retries=0, timeout=3600)
    # No tokenizer here: UTF-8 code runs 3-4 bytes per token, so a byte count halved bounds the reply.
    max_tokens = reply_budget(len(task.text.encode()) // 2, args.max_tokens)
    predicted = bool(task.text) and not args.no_prediction
    # Typed loosely on purpose: `seed` may be None and `localspec` is our extension, not OpenAI's.
    kwargs: dict[str, Any] = dict(
        messages=[m.model_dump(include={"role", "content"}) for m in task.messages()], max_tokens=max_tokens,
        temperature=args.temperature, seed=args.seed, stream=True, stream_options={"include_usage": True},
    )
    if predicted:
        kwargs["prediction"] = {"type": "content", "content": task.prediction()}
    if args.mode != "auto":
        kwargs["extra_body"] = {"localspec": {"mode": args.mode}}
    pieces: list[str] = []
    finish, usage, ext = "stop", None, dict[str, Any]()
    t_first = t_last = 0.0
    try:
        model = args.model or next(iter(client.models.list())).id
        chunks = client.chat.completions.create(model=model, **kwargs)
        for chunk in chunks:
            ext = (getattr(chunk, "model_extra", None) or {}).get("localspec") or ext
            usage = chunk.usage or usage
            for choice in chunk.choices:
                if choice.delta and choice.delta.content:
                    t_last = time.perf_counter()
                    t_first = t_first or t_last
                    pieces.append(choice.delta.content)
                    _show(stream, choice.delta.content, accepted=False)
                if choice.finish_reason:
                    finish = choice.finish_reason
    except openai.APIConnectionError as exc:
        raise LocalspecError(f"Could not reach a server at {base}: {exc}.",
                             "Start it with `localspec serve`, or check the --connect URL.") from None
    except openai.APIStatusError as exc:
        raise LocalspecError(f"The server refused the edit ({exc.status_code}): {_api_message(exc)}",
                             "Nothing was written.") from None
    except StopIteration:
        raise LocalspecError(f"The server at {base} lists no models.", "Name one with --model.") from None
    details = getattr(usage, "completion_tokens_details", None) if usage else None
    return EditOutcome(
        reply="".join(pieces), finish_reason=finish, max_tokens=max_tokens, mode=str(ext.get("mode", "remote")),
        completion_tokens=usage.completion_tokens if usage else len(pieces), accepted=int(ext.get("accepted", 0)),
        prediction_accepted=(details.accepted_prediction_tokens or 0) if predicted and details else None,
        prediction_rejected=(details.rejected_prediction_tokens or 0) if predicted and details else None,
        decode_s=t_last - t_first, speedup=None,
    )


def _api_message(exc: Exception) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    return str(exc)


def _show(stream: TextIO | None, text: str, *, accepted: bool) -> None:
    if stream is None or not text:
        return
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


def run(args: argparse.Namespace) -> int:
    from localspec.edit.files import read_source, write_with_backup
    from localspec.edit.reply import NotWholeFile, extract_file
    from localspec.edit.task import EditTask
    from localspec.errors import UsageError

    if not args.instruction.strip():
        raise UsageError("The instruction is empty.",
                         'Say what to change, e.g. localspec edit app.py "add type hints".')
    if args.max_tokens is not None and args.max_tokens <= 0:
        raise UsageError("--max-tokens must be positive.", "Leave it out to size the reply from the file.")
    source = read_source(Path(args.file))
    task = EditTask(name=source.path.name, text=source.text, instruction=args.instruction)
    stream = sys.stderr if not args.json and sys.stderr.isatty() else None
    outcome = (edit_remotely if args.connect else edit_locally)(args, task, stream)
    if stream is not None:
        stream.write("\n")
    if outcome.error:
        print(f"error: {outcome.error}", file=sys.stderr)
        return 1
    refused, new_text = None, None
    try:
        new_text = extract_file(outcome.reply, original=source.text, finish_reason=outcome.finish_reason,
                                max_tokens=outcome.max_tokens)
    except NotWholeFile as exc:
        refused = str(exc)
    diff = unified_diff(source.text, new_text, task.name) if new_text is not None else ""
    backup = write_with_backup(source, new_text) if args.write and new_text is not None and diff else None
    if args.json:
        print(json.dumps({
            "file": str(source.path), "changed": bool(diff), "text": new_text, "diff": diff, "refused": refused,
            "written": backup is not None, "backup": str(backup) if backup else None, "reply": outcome.reply,
            "stats": {**{k: v for k, v in asdict(outcome).items() if k != "reply"},
                      "target_passes": outcome.target_passes, "tokens_per_pass": round(outcome.tokens_per_pass, 3)},
        }, ensure_ascii=False))
        return 1 if refused else 0
    print(summary(outcome), file=sys.stderr)
    if refused:
        print(f"error: not written, the reply is not a whole file: {refused}.", file=sys.stderr)
        return 1
    if not diff:
        print(f"No changes to {source.path}.", file=sys.stderr)
        return 0
    sys.stdout.write(coloured(diff) if sys.stdout.isatty() else diff)
    if backup is not None:
        print(f"Wrote {source.path} (the old file is {backup}).", file=sys.stderr)
    else:
        print(f"Not written: add --write to replace {source.path} (a backup is kept).", file=sys.stderr)
    return 0
