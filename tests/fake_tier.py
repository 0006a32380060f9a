"""A scripted model: the real Engine, EngineWorker, LocalTier, Pipeline and app, with llama.cpp replaced.

`ScriptedRuntime` implements the part of `ModelRuntime` the engine uses, like
`tests/fake_runtime.py`, but over text: its vocabulary is the 256 bytes plus an end-of-text token
and an end-of-prompt token (SEP), so chat templates, stop strings and UTF-8 streaming work as they
do with a real model. What it answers is a script, a function of the prompt text:

    tier = scripted_tier(name="large", script=scripted({"capital of France": "Paris."}))
    pipe = scripted_pipeline(tiers=[tier])
    app = scripted_app(pipeline=pipe)            # the FastAPI app, behind ServerSettings

How the answer comes out of logits: the tokenizer appends SEP to every prompt it tokenizes with
`add_special=True` (BERT's tokenizer does the same with [SEP]), so at any row the history splits
at its last SEP into the prompt and what was generated so far. The next token is the script's
answer's next byte, with a logit `confidence` above every other token (greedy and sampling agree
on it), then the end-of-text token. The logits depend on the history alone, so speculative
decoding, prefix reuse and rollbacks are exercised exactly; every batch is checked the way
llama.cpp needs it (positions contiguous, nothing stale), as in `FakeRuntime`.

Construction goes through keyword arguments only, so the helpers survive changes to the
positional order of the classes they build.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localspec.engine.config import EngineConfig
from localspec.engine.controller import Controller, Costs
from localspec.engine.runtime import Row, RuntimeConfig
from localspec.engine.scheduler import Engine

EOS = 256  # end of text
SEP = 257  # end of prompt: appended by tokenize(add_special=True)
# Fill-in-the-middle markers are single tokens, as in Qwen's vocabulary, so /v1/completions' suffix works;
# so are Qwen2.5-Coder's repo-level ones, so /infill lays out its extra context as it does for that model.
SPECIAL = {"<|fim_prefix|>": 258, "<|fim_suffix|>": 259, "<|fim_middle|>": 260, "<|repo_name|>": 261,
           "<|file_sep|>": 262}
N_VOCAB = 263
EOS_TEXT = "<|endoftext|>"
_SPECIAL_TEXT = {EOS: EOS_TEXT, SEP: "<|sep|>", **{i: t for t, i in SPECIAL.items()}}
_SPECIAL_SPLIT = re.compile("(" + "|".join(re.escape(t) for t in SPECIAL) + ")")


@dataclass(frozen=True)
class Reply:
    """What the model says to one prompt.

    `confidence`: the answer's logit margin over every other token; at 30 each token's logprob is
    ~0 (a sure model), at 1 it is about -4.6 (an unsure one, for the cascade's escalation rule).
    `fail`: the decode of any row after this prompt raises, as a failed `llama_decode` does.
    `pace_s`: each decode holding a row of this answer takes at least this long, so the answer is
    still streaming when a test acts on it (a client going away, a queue filling up).
    """

    text: str
    confidence: float = 30.0
    fail: str | None = None
    pace_s: float = 0.0


Script = Callable[[str], "Reply | str"]


def scripted(answers: Mapping[str, str | Reply] | None = None, default: str | Reply = "OK.") -> Script:
    """A script from a table: the first key found in the prompt gives the answer, else `default`.

    The prompt is the text the engine tokenized: a chat rendered with ChatML, or a raw prompt.
    """
    table = dict(answers or {})

    def script(prompt: str) -> str | Reply:
        for key, answer in table.items():
            if key in prompt:
                return answer
        return default

    return script


def echo(prefix: str = "You said: ") -> Script:
    """Answers with the last user message (or the raw prompt): distinct prompts, distinct answers."""

    def script(prompt: str) -> str:
        turns = re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", prompt, flags=re.S)
        return prefix + (turns[-1] if turns else prompt)

    return script


class ScriptedRuntime:
    """Implements the part of `ModelRuntime` the engine, its drafters and the endpoint use."""

    def __init__(self, script: Script, *, n_seq_max: int = 1, n_ctx: int = 1024, name: str = "scripted") -> None:
        self.script = script
        self.path = Path(f"{name}.gguf")  # only its name is shown (template checks, errors)
        self.n_vocab = N_VOCAB
        self.eos = EOS
        self.bos = -1
        self.add_bos = False
        self.n_ctx_seq = n_ctx
        self.n_threads = 1
        self.config = RuntimeConfig(n_ctx=n_ctx, n_seq_max=n_seq_max, n_threads=1)
        self.offload = None  # no GPU split: as a CPU build loads
        self.metadata = {"general.architecture": "scripted"}
        self.kv: dict[int, dict[int, int]] = {}
        self.decode_calls = 0
        self.rows_decoded = 0
        self.closed = False
        # Cleared: every decode waits until it is set again, so a test can hold requests in their
        # slots (a queue that fills, a client that goes away mid-answer) for as long as it needs.
        self.running = threading.Event()
        self.running.set()
        self._replies: dict[tuple[int, ...], Reply] = {}
        self._pace = 0.0  # the longest pace_s among the current batch's answers

    # ------------------------------------------------------------------ metadata / text

    def meta(self, key: str) -> str | None:
        return self.metadata.get(key)

    @property
    def chat_template(self) -> str | None:
        return None  # the engine renders ChatML

    def is_eog(self, token: int) -> bool:
        return token == EOS

    def token_text(self, token: int) -> str:
        return _SPECIAL_TEXT.get(token) or self.piece(token).decode("utf-8", errors="replace")

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        ids: list[int] = []
        for part in _SPECIAL_SPLIT.split(text) if parse_special else [text]:
            ids.extend([SPECIAL[part]] if parse_special and part in SPECIAL else part.encode("utf-8"))
        return [*ids, *([SEP] if add_special else [])]

    def piece(self, token: int) -> bytes:
        assert 0 <= token < N_VOCAB, token
        return bytes([token]) if token < 256 else _SPECIAL_TEXT[token].encode() if token in SPECIAL.values() else b""

    def text(self, tokens: Iterable[int]) -> str:
        """A prompt as the script reads it: special tokens spelled out."""
        return b"".join(bytes([t]) if t < 256 else _SPECIAL_TEXT[t].encode() for t in tokens).decode("utf-8", "replace")

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def close(self) -> None:
        self.closed = True
        self.running.set()

    # ------------------------------------------------------------------ KV cache

    def seq_rm(self, seq: int, p0: int, p1: int = -1) -> None:
        assert 0 <= seq < self.config.n_seq_max, f"seq_rm on sequence {seq}"
        lo, hi = max(p0, 0), (float("inf") if p1 < 0 else p1)
        kv = self.kv.setdefault(seq, {})
        for pos in [p for p in kv if lo <= p < hi]:
            del kv[pos]

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        hi = float("inf") if p1 < 0 else p1
        for pos, token in self.kv.get(src, {}).items():
            if p0 <= pos < hi:
                self.kv.setdefault(dst, {})[pos] = token

    def seq_pos_max(self, seq: int) -> int:
        kv = self.kv.get(seq, {})
        return max(kv) if kv else -1

    # ------------------------------------------------------------------ decode

    def reply(self, prompt: tuple[int, ...]) -> Reply:
        """The script's answer to a prompt (token ids up to its SEP), asked once per prompt."""
        got = self._replies.get(prompt)
        if got is None:
            answer = self.script(self.text(prompt))
            got = answer if isinstance(answer, Reply) else Reply(answer)
            self._replies[prompt] = got
        return got

    def logits(self, history: tuple[int, ...]) -> np.ndarray:
        """The next token's logits after `history`: the answer's next byte, then end-of-text."""
        out = np.zeros(N_VOCAB, dtype=np.float32)
        out[SEP] = -np.inf  # never generated, so the split below stays unambiguous
        try:
            cut = len(history) - 1 - history[::-1].index(SEP)
        except ValueError:  # no prompt end yet (a calibration batch): say nothing
            out[EOS] = 30.0
            return out
        reply = self.reply(history[:cut])
        self._pace = max(self._pace, reply.pace_s)
        if reply.fail:
            raise RuntimeError(f"llama_decode failed with code -1 ({reply.fail})")
        said, answer = history[cut + 1:], reply.text.encode("utf-8")
        # A draft's proposal may run past the end-of-text token: nothing follows it but another.
        on_script = all(t < 256 for t in said) and answer.startswith(bytes(said)) and len(said) < len(answer)
        out[answer[len(said)] if on_script else EOS] = reply.confidence
        return out

    def decode(self, rows: list[Row]) -> np.ndarray:
        self.running.wait()
        assert not self.closed, "decode after close"
        assert rows, "empty batch"
        self.decode_calls += 1
        self.rows_decoded += len(rows)
        out: list[np.ndarray] = []
        self._pace = 0.0
        for r in rows:
            assert 0 <= r.seq < self.config.n_seq_max, f"sequence id {r.seq} outside 0..{self.config.n_seq_max - 1}"
            assert 0 <= r.token < N_VOCAB, f"token id {r.token} outside the vocabulary"
            assert 0 <= r.pos < self.n_ctx_seq, f"position {r.pos} outside the context"
            kv = self.kv.setdefault(r.seq, {})
            assert r.pos not in kv, f"seq {r.seq}: position {r.pos} is already in the KV cache (stale cell)"
            assert len(kv) == r.pos and all(i in kv for i in range(r.pos)), (
                f"seq {r.seq}: decoding position {r.pos} over positions {sorted(kv)[:8]}"
            )
            kv[r.pos] = r.token
            if r.logits:
                out.append(self.logits(tuple(kv[i] for i in range(r.pos + 1))))
        if self._pace:
            time.sleep(self._pace)
        return np.stack(out) if out else np.empty((0, N_VOCAB), dtype=np.float32)


class ScriptedEmbedder:
    """Stands in for the MiniLM `Embedder`: the texts of one group are near neighbours, all others far.

    A text's vector is its group's direction (or, outside every group, its own) plus a little of
    its own noise, so a paraphrase's similarity is high but below 1 and two unrelated texts are
    near-orthogonal. Which near neighbour is served is then the cache's guard's call, as with
    real vectors."""

    def __init__(self, groups: Iterable[Iterable[str]] = (), *, dim: int = 64, window: int = 256,
                 spread: float = 0.15) -> None:
        self.group_of = {text: i for i, group in enumerate(groups) for text in group}
        self.dim = dim
        self.window = window
        self.spread = spread
        self.model_path = Path("scripted-embedder.gguf")
        self.fingerprint = "scripted-embedder"

    def _direction(self, key: str) -> np.ndarray:
        seed = np.frombuffer(key.encode("utf-8").ljust(4, b"\0"), dtype=np.uint8)
        return np.random.default_rng(seed).standard_normal(self.dim)

    def count_tokens(self, text: str) -> int:
        return len(text.split()) + 2  # [CLS] words [SEP]

    def fits(self, text: str) -> bool:
        return 0 < self.count_tokens(text) <= self.window and bool(text.strip())

    def truncated(self, text: str) -> str:
        return " ".join(text.split()[:self.window - 2])

    def embed(self, text: str) -> np.ndarray | None:
        if not self.fits(text):
            return None
        group = self.group_of.get(text)
        base = self._direction(f"group {group}" if group is not None else f"text {text}")
        base /= np.linalg.norm(base)
        noise = self._direction(f"noise {text}")
        vec = base + self.spread * noise / np.linalg.norm(noise)
        return (vec / np.linalg.norm(vec)).astype(np.float32)

    def close(self) -> None:
        pass


def scripted_costs() -> Costs:
    """Costs for mode auto without a calibration run: drafting pays, so auto drafts. Pinned: the
    scripted model's microsecond passes must not teach it otherwise."""
    return Costs(verify=[0.010 + 0.001 * n for n in range(17)], draft_step=0.001, draft_row=0.0005, pinned=True)


def scripted_engine(*, script: Script | None = None, draft_script: Script | None = None, mode: str = "off",
                    parallel: int = 2, n_ctx: int = 1024, name: str = "scripted",
                    chat_template: str | None = None) -> Engine:
    """A real `Engine` over scripted runtimes; `draft_script` adds a draft model (for mode draft);
    `chat_template`: the chat template its prompts are rendered with (None: ChatML)."""
    script = script or scripted()
    target = ScriptedRuntime(script, n_seq_max=parallel, n_ctx=n_ctx, name=name)
    draft = None
    if draft_script is not None:
        draft = ScriptedRuntime(draft_script, n_seq_max=parallel, n_ctx=n_ctx, name=f"{name}-draft")
    engine = Engine(target=target, draft=draft, config=EngineConfig(n_ctx=n_ctx, parallel=parallel, mode=mode,
                                                                    pinned_prefix_cells=0, auto_explore=0.0),
                    chat_template=chat_template)
    engine.costs = scripted_costs() if mode == "auto" else None
    return engine


def scripted_tier(*, name: str = "large", script: Script | None = None, model_id: str | None = None,
                  engine: Engine | None = None, **engine_kw):
    """A real `LocalTier` (worker thread running) around a scripted engine."""
    from localspec.pipeline import LocalTier

    engine = engine or scripted_engine(script=script, name=model_id or name, **engine_kw)
    model_id = model_id or f"scripted-{name}"
    return LocalTier(name=name, engine=engine, model_id=model_id, draft_id=None, fingerprint=model_id)


def scripted_pipeline(*, tiers: Iterable | None = None, default_tier: str | None = None, **pipeline_kw):
    """A real `Pipeline` over scripted tiers (one "large" tier answering "OK." when none are given).

    `pipeline_kw` goes to the Pipeline as it is: cache=, settings=, router=, on_finish=, load_tier=.
    """
    from localspec.pipeline import Pipeline

    tiers = list(tiers) if tiers is not None else [scripted_tier()]
    by_name = {t.name: t for t in tiers}
    return Pipeline(tiers=by_name, default_tier=default_tier or tiers[-1].name, **pipeline_kw)


def scripted_backend(*, pipeline=None, routes: Mapping[str, str] | None = None, target_names: Iterable[str] = (),
                     embedder: ScriptedEmbedder | None = None, embedding_id: str = "scripted-embedder", **backend_kw):
    """A real server `Backend` around a pipeline: the default tier's model id and every route name
    are the model names a request may use; `embedder` serves /v1/embeddings as `embedding_id`."""
    from localspec.server import Backend

    if embedder is not None:
        backend_kw.update(embedding_id=embedding_id, embedding_names={embedding_id},
                          embedding_path=embedder.model_path, _shared_embedder=embedder)

    pipeline = pipeline or scripted_pipeline()
    default = pipeline.tiers[pipeline.default_tier]
    routes = dict(routes or {})
    names = {default.model_id, *routes, *target_names}
    routes.setdefault(default.model_id, pipeline.default_tier)
    backend_kw.setdefault("profile", "scripted")
    return Backend(pipeline=pipeline, target_id=default.model_id, target_names=names, draft_id=None,
                   routes=routes, **backend_kw)


def scripted_app(*, pipeline=None, settings=None, gate: threading.Event | None = None, backend=None,
                 embedder: ScriptedEmbedder | None = None, **app_kw):
    """The real FastAPI app, its backend built from `pipeline` (or given) instead of loaded from model
    files. `gate`: the load waits for it, so a test can see the loading state first."""
    from localspec.server import ServerSettings, create_app

    def load(_settings):
        if gate is not None:
            gate.wait()
        return backend or scripted_backend(pipeline=pipeline, embedder=embedder)

    return create_app(settings=settings or ServerSettings(), load=load, **app_kw)


def one_model_app(*, model_id: str, script: Script, settings=None, **backend_kw):
    """The app serving one scripted model under `model_id` (the faces' tests: what a request became
    shows in what the script answers), and its tier."""
    tier = scripted_tier(model_id=model_id, script=script)
    backend = scripted_backend(pipeline=scripted_pipeline(tiers=[tier]), **backend_kw)
    return scripted_app(backend=backend, settings=settings), tier


def record_aheads(monkeypatch, drafter: str) -> list[tuple[int, int, bool | None]]:
    """(drafted, accepted, ahead) of every verify of `drafter`'s drafts that the controller hears from now on:
    what the scheduler's Active.ahead told it past each draft."""
    seen: list[tuple[int, int, bool | None]] = []
    observe = Controller.observe

    def spy(self, choice, drafted, accepted, *args, ahead=None, **kwargs):
        if choice.drafter == drafter:
            seen.append((drafted, accepted, ahead))
        return observe(self, choice, drafted, accepted, *args, ahead=ahead, **kwargs)

    monkeypatch.setattr(Controller, "observe", spy)
    return seen
