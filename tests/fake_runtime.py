"""A stand-in for `ModelRuntime` with a tiny vocabulary and exactly known logits.

The logits at a row are a deterministic function of the sequence's whole token history up to
and including that row's token, so the exact distribution of any continuation can be computed
by walking the tree of histories (see `logits_fn`). The fake keeps a per-sequence KV store
{pos: token} and checks every batch the way llama.cpp would need it to be right: a row's
position must equal the current KV length of its sequence, with positions 0..pos-1 present and
nothing stale above. Any KV bookkeeping mistake in the engine then raises AssertionError
instead of silently conditioning on the wrong history.

Vocabulary: ids 0..n_normal-1 are ordinary tokens ("a", "b", ...); id n_normal is the EOS,
whose logit is -inf, so no correct sampler can ever produce it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from localspec.engine.runtime import Row, RuntimeConfig

LogitsFn = Callable[[tuple[int, ...]], np.ndarray]


def logits_fn(
    n_normal: int,
    salts: Sequence[int],
    scales: Sequence[float],
    step_bonus: float = 0.0,
) -> LogitsFn:
    """Logits for a history: sum_i scales[i] * N(0, 1) noise seeded by (salts[i], history).

    Two functions that share a first salt are correlated (a target and its draft). `step_bonus`
    favours token (last + 1) % n_normal, which makes repeating patterns likely, so prompt lookup
    finds something to propose. Results are cached per history.
    """
    cache: dict[tuple[int, ...], np.ndarray] = {}

    def fn(history: tuple[int, ...]) -> np.ndarray:
        out = cache.get(history)
        if out is None:
            z = np.zeros(n_normal + 1, dtype=np.float64)
            for salt, scale in zip(salts, scales, strict=True):
                z[:n_normal] += scale * np.random.default_rng([salt, len(history), *history]).standard_normal(n_normal)
            if history and step_bonus:
                z[(history[-1] + 1) % n_normal] += step_bonus
            z[n_normal] = -np.inf
            out = z.astype(np.float32)
            out.setflags(write=False)
            cache[history] = out
        return out

    return fn


class FakeRuntime:
    """Implements the part of `ModelRuntime` the engine and the drafter use."""

    def __init__(self, logits: LogitsFn, n_normal: int = 5, n_seq_max: int = 1, n_ctx: int = 512) -> None:
        self.logits = logits
        self.n_normal = n_normal
        self.n_vocab = n_normal + 1
        self.eos = n_normal
        self.bos = -1
        self.add_bos = False
        self.n_ctx_seq = n_ctx
        self.config = RuntimeConfig(n_ctx=n_ctx, n_seq_max=n_seq_max)
        self.offload = None  # no GPU split: as a CPU build loads
        self.kv: dict[int, dict[int, int]] = {}
        self.decode_calls = 0
        self.rows_decoded = 0
        self.closed = False

    # ------------------------------------------------------------------ metadata / text

    @property
    def chat_template(self) -> str | None:
        return None

    def is_eog(self, token: int) -> bool:
        return token == self.eos

    def token_text(self, token: int) -> str:
        return "</s>" if token == self.eos else self.piece(token).decode()

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """'0 1 2' -> [0, 1, 2]."""
        ids = [int(x) for x in text.split()]
        assert all(0 <= t < self.n_vocab for t in ids), f"prompt id out of range: {text!r}"
        return ids

    def piece(self, token: int) -> bytes:
        assert 0 <= token < self.n_vocab, token
        return b"" if token == self.eos else bytes([ord("a") + token])

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode()

    def close(self) -> None:
        self.closed = True

    # ------------------------------------------------------------------ KV cache

    def seq_rm(self, seq: int, p0: int, p1: int = -1) -> None:
        assert 0 <= seq < self.config.n_seq_max, f"seq_rm on sequence {seq}"
        lo = max(p0, 0)
        hi = float("inf") if p1 < 0 else p1
        kv = self.kv.setdefault(seq, {})
        for pos in [p for p in kv if lo <= p < hi]:
            del kv[pos]

    def seq_pos_max(self, seq: int) -> int:
        kv = self.kv.get(seq, {})
        return max(kv) if kv else -1

    def history(self, seq: int) -> list[int]:
        kv = self.kv.get(seq, {})
        return [kv[i] for i in range(len(kv))]

    # ------------------------------------------------------------------ decode

    def decode(self, rows: list[Row]) -> np.ndarray:
        assert not self.closed, "decode after close"
        assert rows, "empty batch"
        self.decode_calls += 1
        self.rows_decoded += len(rows)
        out: list[np.ndarray] = []
        for r in rows:
            assert 0 <= r.seq < self.config.n_seq_max, f"sequence id {r.seq} outside 0..{self.config.n_seq_max - 1}"
            assert 0 <= r.token < self.n_vocab, f"token id {r.token} outside the vocabulary"
            assert 0 <= r.pos < self.n_ctx_seq, f"position {r.pos} outside the context"
            kv = self.kv.setdefault(r.seq, {})
            assert r.pos not in kv, f"seq {r.seq}: position {r.pos} is already in the KV cache (stale cell)"
            missing = [i for i in range(r.pos) if i not in kv]
            assert not missing, f"seq {r.seq}: decoding position {r.pos} with positions {missing[:5]} missing"
            assert len(kv) == r.pos, f"seq {r.seq}: KV holds positions above {r.pos}: {sorted(kv)}"
            kv[r.pos] = r.token
            if r.logits:
                out.append(self.logits(tuple(kv[i] for i in range(r.pos + 1))))
        if not out:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        return np.stack(out)
