"""The engine: a multi-sequence stepper over one target context (and one draft context).

`submit(request, sink=...) -> Handle` queues a request; each `step()` then goes

1. admit: queued requests into free slots (the judge's lane first; a request cancelled while
   queued ends here, without waiting for a slot);
2. draft: each decoding slot's proposal (draft-model steps are batched across slots);
3. build the batch: each decoding slot's [last token, d1..dk] rows, then prompt chunks within a
   per-step budget, so a long prompt neither stalls other streams nor blocks cancellation;
4. decode: one target `llama_decode` for the whole batch;
5. accept: `verify()` per slot on its own logits, its tokens to its sink, a KV rollback of what was rejected.

Each slot keeps the list of tokens its target KV cache holds: the whole of the KV bookkeeping. A
rollback truncates it (and `llama_memory_seq_rm`s the cells); a new request reuses the longest
common prefix with it, so a chat does not re-read its history. `generate(request)` is a thin loop
over `submit` and `step` for one caller.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from localspec.engine import calibrate
from localspec.engine.chat import check_jinja
from localspec.engine.config import EngineConfig, GenerationRequest, RequestDefaults
from localspec.engine.controller import AcceptanceBook, Controller, Explorer
from localspec.engine.costs import Costs
from localspec.engine.drafters import DraftJob, DraftModelDrafter, LookupHistory, PromptLookupDrafter, common_prefix
from localspec.engine.events import Done, Event, FinishReason, Origin, ProgressFn, Stats, Token
from localspec.engine.grammar import Grammar
from localspec.engine.prediction import prepare
from localspec.engine.loading import check_vocabularies, load_runtimes
from localspec.engine.offload import OffloadPlanner
from localspec.engine.runtime import ModelRuntime, Row
from localspec.engine.prompt import Prompter
from localspec.engine.picking import grammar_tokens, pick, settled_targets, target_rows
from localspec.engine.batch import Batch
from localspec.engine.slots import Active, EventSink, Handle, Lane, Pending, Slot, speculation, token_logprob
from localspec.engine.text import StopMatcher
from localspec.engine.verify import Draft, PositionRng, verify, verify_greedy
from localspec.errors import RequestError

__all__ = ["Engine", "Handle", "Lane"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class Engine:
    def __init__(
        self,
        target: ModelRuntime,
        draft: ModelRuntime | None = None,
        config: EngineConfig | None = None,
        calibration_dir: str | None = None,
        *, defaults: RequestDefaults | None = None,  # the target's own request defaults (model settings)
        chat_template: str | None = None,  # used instead of the target's GGUF template (model settings)
    ) -> None:
        check_jinja()  # chat templates are untrusted code: refuse a sandbox known to leak
        self.config = config or EngineConfig()
        self.calibration_dir = calibration_dir
        self.costs: Costs | None = None  # measured lazily, for mode auto
        self.target = target
        self.draft = draft
        self.drafter: DraftModelDrafter | None = None
        if draft is not None:
            check_vocabularies(target, draft)
            self.drafter = DraftModelDrafter(draft, target.n_vocab, self.config.draft_p_min)
        self.lookup = PromptLookupDrafter(self.config.lookup_n_min, self.config.lookup_n_max,
                                          LookupHistory(self.config.lookup_history_tokens))
        self.acceptance = AcceptanceBook()  # auto's drafter statistics, learned across requests
        self.explorer = Explorer(budget=self.config.auto_explore)  # shared: the budget is the engine's time
        self.cost_file: calibrate.CostFile | None = None  # where learned costs go (set by calibrate)
        self.slots = [Slot(seq=i) for i in range(self.config.parallel)]
        # One prompt prefix that many requests share (the cache judge's) lives in a sequence past the
        # slots: a slot used since for other work gets it back by a zero-copy seq_cp, not a prefill.
        self._pin_seq = self.config.parallel if target.config.pinned_cells else None
        self.defaults = defaults or RequestDefaults()
        self.prompter = Prompter(target, n_ctx=self.config.n_ctx,
                                 pinned_cells=target.config.pinned_cells if self._pin_seq is not None else 0,
                                 chat_template=chat_template)
        self.chat_check = self.prompter.chat_check
        self._pinned: list[int] = []
        self._pending: deque[Pending] = deque()
        self._lock = threading.Lock()
        self._next_id = 0
        self.steps = 0
        self.last_step_sequences = 0  # sequences that had rows in the last target decode
        self.max_step_sequences = 0

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(
        cls,
        target_path: str,
        draft_path: str | None = None,
        config: EngineConfig | None = None,
        calibration_dir: str | None = None,
        *, on_progress: ProgressFn | None = None,  # hears each model's load and the calibration
        offload: OffloadPlanner | None = None,  # splits layers between GPU and CPU (see engine.offload)
        defaults: RequestDefaults | None = None,
        chat_template: str | None = None,
    ) -> Engine:
        config = config or EngineConfig()
        target, draft = load_runtimes(target_path, draft_path, config, on_progress=on_progress, offload=offload)
        try:
            engine = cls(target, draft, config, calibration_dir, defaults=defaults, chat_template=chat_template)
            if config.mode == "auto":
                engine.calibrate(on_progress=on_progress)
            return engine
        except BaseException:
            target.close()
            if draft:
                draft.close()
            raise

    def calibrate(self, *, on_progress: ProgressFn | None = None) -> Costs:
        """Measure (or load cached) verify and draft costs; needs an idle engine."""
        if self.costs is None:
            if any(s.active for s in self.slots):
                raise RuntimeError("calibration needs an idle engine")
            cache = Path(self.calibration_dir) if self.calibration_dir else None
            for slot in self.slots[:1]:
                self._reset_kv(slot)
            k_max = max(self.config.auto_k_max, self.config.copy_k_max)  # the longest verify auto plans for
            self.costs, self.cost_file = calibrate.load_or_measure(self.target, self.draft, k_max,
                                                                    cache, on_progress=on_progress)
        return self.costs

    def save_costs(self, *, every: int = 0) -> None:
        """Report what the passes taught: a reload and the next process start from it (CostFile.save)."""
        if self.costs is not None and self.cost_file is not None:
            self.cost_file.save(self.costs, every=every)

    def close(self) -> None:
        self.save_costs()
        self.target.close()
        if self.draft is not None:
            self.draft.close()

    # ------------------------------------------------------------------ requests

    def prompt_tokens(self, request: GenerationRequest) -> tuple[list[int], int]:
        """Tokenize a request; returns (tokens, messages dropped by the truncate policy)."""
        return self.prompter.tokens(request)

    def with_defaults(self, request: GenerationRequest) -> GenerationRequest:
        """The request as this engine runs it: the target's own defaults under the request's values."""
        return self.defaults.apply(request)

    def submit(self, request: GenerationRequest, *, sink: EventSink | None = None,
               lane: Lane = Lane.GENERATION) -> Handle:
        """Validate and queue a request. Raises RequestError subclasses for bad input.

        `sink` receives its events on the engine's thread (else they wait in `handle.events`);
        `lane` JUDGE is admitted before queued generations."""
        request = self.with_defaults(request)
        mode = request.mode or self.config.mode
        if mode == "draft" and self.drafter is None:
            raise RequestError("Mode 'draft' needs a draft model and none is loaded.",
                               "Load one, or use --mode lookup/off.")
        tokens, dropped = self.prompt_tokens(request)
        if mode == "auto" and self.costs is None and not self.busy:
            self.calibrate()
        # The runtime's vocabulary pointer: grammars are compiled against the target's tokens.
        grammar = (
            Grammar.compile(self.target._vocab, self.target.n_vocab, request.grammar, self.target.eos)
            if request.grammar else None
        )
        pin_len = self.prompter.pin_length(request, tokens)  # renders the shared messages: outside the lock
        prediction = None if request.prediction is None else \
            prepare(request.prediction, self.target, n_ctx=self.config.n_ctx)
        with self._lock:
            handle = Handle(self._next_id, sink=sink, lane=lane, grammar=grammar, pin_len=pin_len,
                            prediction=prediction, dropped_messages=dropped)
            self._next_id += 1
            entry = Pending(handle, request, tokens, time.perf_counter())
            if lane is Lane.JUDGE:  # behind earlier judgements, ahead of every generation
                ahead = sum(1 for p in self._pending if p.handle.lane is Lane.JUDGE)
                self._pending.insert(ahead, entry)
            else:
                self._pending.append(entry)
        return handle

    def generate(self, request: GenerationRequest) -> Iterator[Event]:
        """Submit one request and step the engine until it is done, yielding its events."""
        handle = self.submit(request)
        try:
            while True:
                while True:
                    try:
                        event = handle.events.get_nowait()
                    except queue.Empty:
                        break
                    yield event
                    if isinstance(event, Done):
                        return
                self.step()
        finally:
            if not handle.done.is_set():
                handle.cancel()
                while not handle.done.is_set():
                    self.step()

    @property
    def busy(self) -> bool:
        return bool(self._pending) or any(s.active for s in self.slots)

    # ------------------------------------------------------------------ the step

    def step(self) -> bool:
        """Advance every active request by one target pass. Returns False when idle.

        admit → draft → build the batch → decode → accept. A fault in one slot's part (admitting, drafting,
        building rows, verifying) fails that slot's request once, with finish_reason "error", and frees
        the slot; the other slots go on."""
        self._admit()
        self._end_cancelled()
        running = [s for s in self.slots if s.active]
        if not running:
            return False
        drafts = self._draft([s for s in running if s.current.decoding])
        batch = self._build_batch(running, drafts)
        if not batch.parts:
            return True
        logits = self._decode(batch)
        if logits is None:
            return True
        now = time.perf_counter()
        for part, rows in batch.split(logits):
            if part.draft is not None:
                self._guarded(part.slot, self._accept, part.slot, part.draft, rows, now)
            elif part.n_logits:  # the prompt's last chunk: its last row gives the first token
                self._guarded(part.slot, self._first_token, part.slot, rows[0], now)
        return True

    def _end_cancelled(self) -> None:
        for slot in self.slots:
            if slot.active and slot.active.handle.cancelled:
                self._guarded(slot, self._finish, slot, "cancelled")

    def _build_batch(self, running: list[Slot], drafts: dict[int, Draft]) -> Batch:
        """Verify rows of every decoding slot first, then prompt chunks within the prefill budget."""
        batch = Batch()
        for slot in running:
            if slot.active is not None and slot.active.decoding:
                rows = self._guarded(slot, self._verify_rows, slot, drafts[slot.seq])
                if rows is not None:
                    batch.add(slot, rows, drafts[slot.seq])
        budget = self.config.prefill_budget
        for slot in running:
            if slot.active is not None and not slot.active.decoding and budget > 0:
                rows = self._guarded(slot, self._prefill_rows, slot, budget)
                if rows is not None:
                    batch.add(slot, rows, None)
                    budget -= len(rows)
        return batch

    def _decode(self, batch: Batch) -> np.ndarray | None:
        """The step's one target pass. A failed decode fails every slot in it: their KV state is unknown."""
        try:
            t0 = time.perf_counter()
            logits = self.target.decode(batch.rows)
            if self.costs is not None and batch.all_verify:  # every row a logits row: a verify's timing
                self.costs.observe_verify(len(batch.rows), time.perf_counter() - t0,
                                          context=max(len(p.slot.kv) for p in batch.parts), sequences=len(batch.parts))
        except Exception as exc:
            for i, part in enumerate(batch.parts):
                self._fail(part.slot, exc, log=i == 0)
            return None
        self.steps += 1
        self.last_step_sequences = len(batch.parts)
        self.max_step_sequences = max(self.max_step_sequences, len(batch.parts))
        return logits

    def _verify_rows(self, slot: Slot, d: Draft) -> list[Row]:
        """[last token, d1..dk] with logits: the target's verdict on a slot's draft."""
        a = slot.current
        base = len(a.tokens) - 1
        rows = [Row(t, base + i, slot.seq, logits=True) for i, t in enumerate([a.tokens[-1], *d.tokens])]
        slot.kv.extend(r.token for r in rows)
        return rows

    def _prefill_rows(self, slot: Slot, budget: int) -> list[Row]:
        """The next chunk of a slot's prompt. The last token, the one row with logits, is read alone as
        when the rest is reused (_admit_into): a row's floats depend on its batch, and so the same
        prompt gets the same greedy answer whether or not an earlier request left its KV behind."""
        a = slot.current
        start = len(slot.kv)
        end = a.n_prompt if start == a.n_prompt - 1 else min(a.n_prompt - 1, start + budget)
        chunk = a.tokens[start:end]
        last = start + len(chunk) == a.n_prompt
        rows = [Row(t, start + i, slot.seq, logits=last and i == len(chunk) - 1) for i, t in enumerate(chunk)]
        slot.kv.extend(chunk)
        if self.drafter is not None and self._wants_draft_prefill(a):
            self.drafter.sync(slot.seq, a.tokens[: a.n_prompt], budget=len(chunk))
        return rows

    def _guarded(self, slot: Slot, fn: Callable[..., T], *args: Any) -> T | None:
        """Run one slot's part of the step; a fault fails that slot's request and nothing else."""
        try:
            return fn(*args)
        except Exception as exc:
            self._fail(slot, exc)
            return None

    def _fail(self, slot: Slot, exc: BaseException, log: bool = True) -> None:
        """End a slot's request with finish_reason "error" (once) and free the slot and its KV cells."""
        a = slot.active
        if a is None:
            return
        error = f"{type(exc).__name__}: {exc}"
        if log:
            logger.error("request %d failed in the engine: %s", a.handle.id, error, exc_info=exc)
        try:
            self._reset_kv(slot)  # the cells may be half-written: drop them all
        except Exception:  # noqa: BLE001 - an unknown KV state: the slot's next request resets it again
            slot.kv = [-1]
        if a.grammar is not None:
            try:
                a.grammar.close()
            except Exception:  # noqa: BLE001 - the request is over either way
                pass
        if a.t_first:
            a.stats.decode_ms = (a.t_last - a.t_first) * 1000
        slot.active = None
        self.save_costs(every=calibrate.SAVE_EVERY)
        a.handle.finish(Done(finish_reason="error", stats=a.stats, text="".join(a.text), error=error))

    def fail_all(self, exc: BaseException) -> None:
        """Fail every running and queued request (the step loop hit a fault it cannot place)."""
        for slot in self.slots:
            self._fail(slot, exc, log=False)
        with self._lock:
            pending, self._pending = list(self._pending), deque()
        for p in pending:  # their grammars (if any) free themselves when collected
            p.handle.finish(Done(finish_reason="error", stats=Stats(), text="", error=f"{type(exc).__name__}: {exc}"))

    def _admit(self) -> None:
        """Move queued requests into free slots, preferring the slot whose KV shares the most prefix.
        A request cancelled while it waited ends now: its client is gone and a slot may be far off."""
        with self._lock:
            gone = [p for p in self._pending if p.handle.cancelled]
            if gone:
                self._pending = deque(p for p in self._pending if not p.handle.cancelled)
            while self._pending:
                free = [s for s in self.slots if s.active is None]
                if not free:
                    break
                p = self._pending.popleft()
                handle, request, tokens, t_submit = p.handle, p.request, p.tokens, p.t_submit
                slot = max(free, key=lambda s: common_prefix(s.kv, tokens))
                try:
                    self._admit_into(slot, handle, request, tokens, t_submit)
                except Exception as exc:
                    if slot.active is None:  # failed before it held the slot: _fail still ends it
                        slot.active = Active(handle=handle, request=request, tokens=list(tokens),
                                             n_prompt=len(tokens), mode="off", k=0, rng=PositionRng(0),
                                             stats=Stats(prompt_tokens=len(tokens)), t_submit=t_submit,
                                             grammar=handle.grammar)
                    self._fail(slot, exc)
        for p in gone:
            p.handle.finish(Done(finish_reason="cancelled", stats=Stats(prompt_tokens=len(p.tokens)), text=""))

    def _admit_into(self, slot: Slot, handle: Handle, request: GenerationRequest, tokens: list[int],
                    t_submit: float) -> None:
        # Keep at least the last prompt token to decode (alone, as _prefill_rows does): it gives the first token.
        keep = min(common_prefix(slot.kv, tokens), len(tokens) - 1)
        pinned = len(self._pinned)
        if self._pin_seq is not None and keep < pinned <= handle.pin_len and tokens[:pinned] == self._pinned:
            self._reset_kv(slot)  # the pinned prefix replaces the slot's shorter match
            self.target.seq_cp(self._pin_seq, slot.seq)
            slot.kv = list(self._pinned)
            keep = pinned
        else:
            self._truncate(slot, keep)
        spec = speculation(request, self.config, calibrated=self.costs is not None,
                           sampled_grammar=handle.grammar is not None and not request.sampling.greedy,
                           has_prediction=handle.prediction is not None)
        seed = request.sampling.seed if request.sampling.seed is not None else random.getrandbits(63)
        stats = Stats(mode=spec.mode, prompt_tokens=len(tokens), reused_prefix_tokens=keep,
                      prediction_tokens=len(handle.prediction.tokens) if handle.prediction else 0)
        active = Active(
            handle=handle, request=request, tokens=list(tokens), n_prompt=len(tokens), mode=spec.mode,
            k=spec.k, rng=PositionRng(seed), stats=stats, t_submit=t_submit,
            t_admit=time.perf_counter(), stop=StopMatcher(request.stop), grammar=handle.grammar,
            prediction=handle.prediction if spec.use_prediction else None,
        )
        if spec.mode == "auto" and self.costs is not None:
            active.controller = Controller(self.costs, k_max=spec.k, has_draft_model=self.drafter is not None,
                                           book=self.acceptance, explorer=self.explorer, copy_k_max=spec.copy_k,
                                           lookup_min=self.lookup.n_max if active.prediction is not None else 0)
        slot.active = active

    def _draft(self, decoding: list[Slot]) -> dict[int, Draft]:
        """Each decoding slot's proposal; the draft model's are one batch across slots."""
        drafts: dict[int, Draft] = {}
        jobs: list[tuple[Slot, DraftJob]] = []
        for slot in decoding:
            job = self._guarded(slot, self._plan_draft, slot, drafts)
            if job is not None:
                jobs.append((slot, job))
        if not jobs or self.drafter is None:
            return drafts
        t0 = time.perf_counter()
        calls = self.drafter.decode_calls
        try:
            proposals = self.drafter.propose_many([job for _, job in jobs])
        except Exception as exc:  # the draft KV of every slot in the batch is unknown
            for i, (slot, _) in enumerate(jobs):
                self._fail(slot, exc, log=i == 0)
            return drafts
        for (_, job), d in zip(jobs, proposals, strict=True):  # one proposal per job
            drafts[job.seq] = d
        if self.costs is not None and len(jobs) == 1 and self.drafter.decode_calls > calls:
            # Includes the catch-up call; close enough for a smoothed per-step estimate.
            self.costs.observe_draft_step((time.perf_counter() - t0) / (self.drafter.decode_calls - calls))
        return drafts

    def _plan_draft(self, slot: Slot, drafts: dict[int, Draft]) -> DraftJob | None:
        """A slot's drafter and k for this step: a lookup, prediction (or no) draft now, or a job for
        the draft model. A prediction that has a proposal takes precedence in every mode but auto,
        where it is one more drafter the controller weighs."""
        a = slot.current
        # No point drafting past max_tokens or the end of the context.
        room = min(a.request.max_tokens - a.generated - 1, self.config.n_ctx - len(a.tokens))
        k = min(a.k, room)
        pk = 0
        if a.prediction is not None:
            a.prediction.follow(a.tokens, start=a.n_prompt)
            pk = min(self.config.prediction_k_max, room, a.prediction.available())
        mode, lookup, a.proposal = a.mode, None, Draft(())  # auto's proposal is for this step only
        if mode == "auto" and max(k, pk) > 0:
            mode, k, lookup = self._auto_choice(slot, room, pk)
        elif pk > 0:
            mode, k = "prediction", pk
        if k <= 0 or mode == "off":
            drafts[slot.seq] = Draft(())
        elif mode == "prediction" and a.prediction is not None:
            drafts[slot.seq] = a.prediction.propose(k)
        elif mode == "lookup":
            lookup = lookup or self.lookup.propose(a.tokens, k, a.request.history_scope, rule=a.pick_rule)
            drafts[slot.seq] = replace(lookup, tokens=lookup.tokens[:k], odds=lookup.odds[:k])
        else:
            return DraftJob(slot.seq, list(a.tokens), k, a.request.sampling, a.rng)
        return None

    def _auto_choice(self, slot: Slot, room: int, prediction_cap: int) -> tuple[str, int, Draft]:
        """The controller's pick of drafter and k within `room`, and the lookup proposal it weighed."""
        a = slot.current
        if a.controller is None:
            raise RuntimeError("mode auto without its controller")
        lag = self.drafter.lag(slot.seq, a.tokens) if self.drafter else 0
        a.proposal = proposal = self.lookup.propose(a.tokens, min(room, a.controller.copy_k_max),
                                                    a.request.history_scope, prompt=a.n_prompt, rule=a.pick_rule)
        a.choice = a.controller.choose(
            lag, a.lookup_match, len(proposal), room, context=len(a.tokens), lookup_earlier=a.lookup_earlier,
            lookup_repeat=a.lookup_repeat, prediction_streak=a.prediction_streak, prediction_available=prediction_cap,
            prediction_cap=prediction_cap, prediction_odds=a.prediction_odds(prediction_cap), lookup_odds=proposal.odds)
        a.stats.record_choice(a.choice.drafter, explored=a.choice.explored, why_not=a.controller.why_not)
        return a.choice.drafter, a.choice.k, proposal

    def _wants_draft_prefill(self, a: Active) -> bool:
        if a.mode == "draft":
            return True
        # auto: read the prompt into the draft only if drafting is expected to pay once caught up.
        return a.controller is not None and a.controller.choose(0, 0, 0, a.k, explore=False).drafter == "draft"

    # ------------------------------------------------------------------ outcomes

    def _first_token(self, slot: Slot, row: np.ndarray, now: float) -> None:
        a = slot.current
        a.stats.prefill_ms = (now - a.t_admit) * 1000
        a.decoding = True
        self._emit(slot, [pick(a, row)], "target", now, rows=row[None, :])

    def _accept(self, slot: Slot, d: Draft, rows: np.ndarray, now: float) -> None:
        a = slot.current
        # Greedy and grammar-constrained rows are point masses: the same rule, without the vectors.
        if a.grammar is not None:
            verdict = verify_greedy(grammar_tokens(a, rows, d.tokens, self.target.is_eog), d)
        elif a.request.sampling.greedy:
            targets, settled = settled_targets(a, rows, d)
            verdict = verify_greedy(targets, d)
            a.stats.near_ties_settled += settled
        else:
            verdict = verify(target_rows(a, rows, d.tokens), d, a.rng, start_pos=len(a.tokens))
        a.stats.target_passes += 1
        if a.choice is not None and a.controller is not None:
            a.controller.observe(a.choice, len(d), verdict.accepted, a.lookup_match, lookup_earlier=a.lookup_earlier,
                                 lookup_repeat=a.lookup_repeat, ahead=a.ahead(d, verdict))
            a.choice = None
        if len(d):
            a.stats.drafted += len(d)
            a.stats.accepted += verdict.accepted
            a.stats.record_position(len(d), verdict.accepted)
            if d.source == "prediction":
                a.stats.prediction_drafted += len(d)
                a.stats.prediction_accepted += verdict.accepted
        accepted = list(d.tokens[: verdict.accepted])
        history = a.tokens + accepted + [verdict.next_token]
        # Roll back the target KV to what the accepted history shares with it.
        self._truncate(slot, min(common_prefix(slot.kv, history), len(history) - 1))
        if accepted:
            origin: Origin = "prediction" if d.source == "prediction" else "draft"
            self._emit(slot, accepted, origin, now, rows=rows[: len(accepted)])
        if slot.active is a:  # not finished by a stop among the accepted tokens
            self._emit(slot, [verdict.next_token], "target", now, rows=rows[len(accepted) : len(accepted) + 1])
        if slot.active is a and self.drafter is not None and a.mode in ("draft", "auto"):
            self.drafter.rollback(slot.seq, a.tokens)

    def _emit(self, slot: Slot, tokens: list[int], origin: Origin, now: float, rows: np.ndarray | None = None) -> None:
        """`rows`: the target logits each token was chosen from, for logprobs and its gap (Active.gaps)."""
        a = slot.current
        for i, token in enumerate(tokens):
            if a.stats.completion_tokens == 0:
                a.t_first = now
                a.stats.ttft_ms = (now - a.t_submit) * 1000
            a.t_last = now
            a.note_gap(rows[i] if rows is not None and i < len(rows) else None, token)
            if self.target.is_eog(token):
                self._finish(slot, "stop", eog=token)
                return
            a.tokens.append(token)
            a.stats.completion_tokens += 1
            if a.grammar is not None:
                a.grammar.accept(token)
            text, stopped = a.stop.feed(a.utf8.feed(self.target.piece(token)))
            if text:
                a.text.append(text)
            lp = None
            if a.request.logprobs is not None and rows is not None and i < len(rows):
                lp = token_logprob(rows[i], token, a.request.logprobs)
            a.handle.deliver(Token(text=text, ids=(token,), origin=origin, logprob=lp))
            if stopped:
                self._finish(slot, "stop", flush=False)
                return
            if a.generated >= a.request.max_tokens or len(a.tokens) >= self.config.n_ctx:
                self._finish(slot, "length")
                return

    def _finish(self, slot: Slot, reason: FinishReason, error: str | None = None, flush: bool = True,
                eog: int | None = None) -> None:  # eog: the end token that ended it (not in a.tokens)
        a = slot.current
        if flush and reason != "error":
            tail = a.stop.feed(a.utf8.flush())[0] + a.stop.flush()
            if tail:
                a.text.append(tail)
                a.handle.deliver(Token(text=tail, ids=(), origin="target"))
        if a.t_first:
            a.stats.decode_ms = (a.t_last - a.t_first) * 1000
        # Keep only KV cells that match the final history, for the next request's prefix reuse. A cancelled
        # request (client gone) frees its generated cells; its prompt stays: a retry is the likeliest next request.
        keep = common_prefix(slot.kv, a.tokens)
        self._pin(slot, a, keep)
        self._truncate(slot, min(keep, a.n_prompt) if reason == "cancelled" else keep)
        if self.drafter is not None:
            self.drafter.rollback(slot.seq, a.tokens[: a.n_prompt] if reason == "cancelled" else a.tokens)
        if a.grammar is not None:
            a.grammar.close()
        if reason in ("stop", "length") and a.handle.lane is not Lane.JUDGE:  # a judge's prompt is not a client's
            self.lookup.history.add(a.request.history_scope, a.tokens, end=eog, gaps=a.gaps, rule=a.pick_rule)
        slot.active = None
        self.save_costs(every=calibrate.SAVE_EVERY)
        a.handle.finish(Done(finish_reason=reason, stats=a.stats, text="".join(a.text), error=error,
                             stop_sequence=a.stop.matched))  # set by a stop string only, which ends it "stop"

    # ------------------------------------------------------------------ KV bookkeeping

    def _pin(self, slot: Slot, a: Active, computed: int) -> None:
        """Keep the shared prefix of a pin_prefix request once its slot has computed it."""
        n = a.handle.pin_len
        if n and self._pin_seq is not None and computed >= n and a.tokens[:n] != self._pinned:
            self.target.seq_rm(self._pin_seq, 0, -1)
            self.target.seq_cp(slot.seq, self._pin_seq, 0, n)
            self._pinned = a.tokens[:n]

    def _truncate(self, slot: Slot, n: int) -> None:
        if n < len(slot.kv):
            self.target.seq_rm(slot.seq, n, -1)
            del slot.kv[n:]

    def _reset_kv(self, slot: Slot) -> None:
        self.target.seq_rm(slot.seq, 0, -1)
        slot.kv.clear()
        if self.drafter is not None:
            self.drafter.forget(slot.seq)
