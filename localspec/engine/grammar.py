"""Grammar-constrained decoding: which tokens a llama.cpp GBNF grammar allows next.

The engine keeps its own sampling (so speculative verification stays exact) and uses the
grammar only as a filter on the target's logits:

* greedy: the allowed argmax, found by checking candidates in logit order (a few, usually one);
* sampled: draw from p; if the grammar refuses the draw, draw again from p restricted to the
  allowed tokens. The result is exactly p restricted to the allowed set (the first draw lands on
  an allowed t with p(t); otherwise, with probability 1 - V, the second gives p(t)/V).

llama.cpp aborts the process when a grammar is made to accept a token it refuses, so callers
only `accept` tokens that `allows`/`best` approved. Its parser recurses once per nested group:
grammars are bounded first (`grammar_limits.check_gbnf`) and parsed on a thread of our own with a
known, large stack, whatever thread asked.
"""

from __future__ import annotations

import ctypes
import queue
import threading
from collections.abc import Callable
from typing import TypeVar

import llama_cpp
import numpy as np

from localspec.engine.grammar_limits import GrammarUnparsable, check_gbnf

_T = TypeVar("_T")
PARSER_STACK_BYTES = 256 << 20  # address space, not memory: pages are touched only as deep as a parse goes


class _BigStackThread:
    """One daemon thread with a large stack that runs calls in order and hands back their results."""

    def __init__(self, stack_bytes: int) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[], object], queue.SimpleQueue[tuple[bool, object]]]] = (
            queue.SimpleQueue())
        self._stack_bytes = stack_bytes
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _start(self) -> None:
        old = threading.stack_size(self._stack_bytes)
        try:
            self._thread = threading.Thread(target=self._loop, name="localspec-grammar", daemon=True)
            self._thread.start()
        finally:
            threading.stack_size(old)

    def _loop(self) -> None:
        while True:
            call, reply = self._calls.get()
            try:
                reply.put((True, call()))
            except BaseException as exc:  # handed to the caller, which raises it
                reply.put((False, exc))

    def run(self, call: Callable[[], _T]) -> _T:
        with self._lock:
            if self._thread is None:
                self._start()
        reply: queue.SimpleQueue[tuple[bool, object]] = queue.SimpleQueue()
        self._calls.put((call, reply))
        ok, value = reply.get()
        if not ok:
            raise value  # type: ignore[misc]
        return value  # type: ignore[return-value]


_PARSER = _BigStackThread(PARSER_STACK_BYTES)

_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)
_CANDIDATES = 32  # logits checked per round when looking for the allowed argmax


class Grammar:
    """One request's grammar state. Not thread-safe: the engine thread owns it after submit."""

    def __init__(self, sampler, n_vocab: int, eos: int) -> None:
        self._smpl = sampler
        self.n_vocab = n_vocab
        self.eos = eos  # what `best` returns at a dead end, so the answer ends instead of breaking

    @classmethod
    def compile(cls, vocab, n_vocab: int, gbnf: str, eos: int, root: str = "root") -> Grammar:
        """Parse GBNF for a vocabulary (a `llama_vocab` pointer). Raises GrammarTooLarge when the grammar
        is over the bounds, GrammarUnparsable when llama.cpp cannot parse it."""
        check_gbnf(gbnf)
        text, start = gbnf.encode("utf-8"), root.encode("utf-8")
        smpl = _PARSER.run(lambda: llama_cpp.llama_sampler_init_grammar(vocab, text, start))
        if not smpl:
            raise GrammarUnparsable(
                "The grammar could not be parsed by llama.cpp.",
                "Check the GBNF (a `root ::= ...` rule, every rule it names defined, no left recursion) or the "
                "JSON schema it came from; the server log has llama.cpp's message.",
            )
        return cls(smpl, n_vocab, eos)

    def clone(self) -> Grammar:
        return Grammar(llama_cpp.llama_sampler_clone(self._smpl), self.n_vocab, self.eos)

    def accept(self, token: int) -> None:
        llama_cpp.llama_sampler_accept(self._smpl, int(token))

    def _apply(self, ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
        """The logits of `ids` with refused tokens at -inf."""
        arr = np.empty(ids.shape[0], dtype=_TOKEN_DATA)
        arr["id"] = ids
        arr["logit"] = logits
        arr["p"] = 0.0
        cur = llama_cpp.llama_token_data_array(
            data=ctypes.cast(arr.ctypes.data, llama_cpp.llama_token_data_p),
            size=ids.shape[0], selected=-1, sorted=False,
        )
        llama_cpp.llama_sampler_apply(self._smpl, ctypes.byref(cur))
        return arr["logit"]

    def allows(self, token: int) -> bool:
        return bool(np.isfinite(self._apply(np.array([token], dtype=np.int32), np.zeros(1, np.float32))[0]))

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """The whole row with every refused token at -inf (costs a pass over the vocabulary)."""
        n = min(logits.shape[0], self.n_vocab)
        out = np.full(logits.shape[0], -np.inf, dtype=np.float32)
        out[:n] = self._apply(np.arange(n, dtype=np.int32), logits[:n].astype(np.float32))
        return out

    def best(self, logits: np.ndarray) -> int:
        """The highest-logit token the grammar allows; `eos` when it allows none."""
        n = min(logits.shape[0], self.n_vocab)
        row = logits[:n].astype(np.float32)
        k = min(_CANDIDATES, n)
        top = np.argpartition(-row, k - 1)[:k]
        top = top[np.argsort(-row[top], kind="stable")].astype(np.int32)
        ok = np.isfinite(self._apply(top, row[top]))
        if ok.any():
            return int(top[int(np.argmax(ok))])
        masked = self.mask(row)  # the likely tokens are all refused: check the whole vocabulary
        if not np.isfinite(masked).any():
            return self.eos
        return int(np.argmax(masked))

    def close(self) -> None:
        if self._smpl:
            llama_cpp.llama_sampler_free(self._smpl)
            self._smpl = None

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass

