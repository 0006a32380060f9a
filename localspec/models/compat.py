"""Can this draft model propose tokens for that target? Checked from GGUF metadata alone.

Speculative decoding compares token ids, so both models must share the tokenizer. Checks, in order:
1. tokenizer model (``tokenizer.ggml.model``: gpt2/llama/bert…) is equal;
2. vocabulary sizes differ by at most 128 (llama.cpp's tolerance: Qwen2.5 7B–32B pad the
   embedding table to 152064 while 0.5B/1.5B have 151936; the extra ids are never produced by
   the tokenizer, and DraftCompat carries both sizes so the engine pads the draft distribution);
3. BOS and EOS ids are equal where both models define them;
4. every token text over the common id range is equal, except ids that either model marks as
   control, user-defined or unused (``tokenizer.ggml.token_type`` 3/4/5). llama.cpp instead
   skips the first 5 ids; skipping by type is stricter for ordinary tokens and still ignores
   special tokens, whose texts legitimately differ between conversions of one tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localspec.errors import IncompatibleDraftError
from localspec.models.gguf_info import GGUFMeta, read_header

MAX_VOCAB_DIFF = 128
_SKIP_TYPES = (3, 4, 5)  # CONTROL, USER_DEFINED, UNUSED


@dataclass(frozen=True)
class DraftCompat:
    """What the engine needs to pair a draft with a target (plain values; no imports needed)."""

    target_n_vocab: int
    draft_n_vocab: int
    tokenizer_model: str
    bos_token_id: int | None
    eos_token_id: int | None
    tokens_compared: int

    @property
    def vocab_padding(self) -> int:
        """How many ids to pad the draft's distribution with to match the target's vocabulary."""
        return max(0, self.target_n_vocab - self.draft_n_vocab)


def _fail(what: str, target: object, draft: object, fix: str | None = None) -> IncompatibleDraftError:
    return IncompatibleDraftError(
        f"draft {what} {draft!r} differs from target {target!r}.",
        fix or "Use a draft from the same model family as the target (see `localspec models list`).",
    )


def _types(meta: GGUFMeta, n: int) -> np.ndarray:
    t = meta.get("tokenizer.ggml.token_type")
    if t is None:
        return np.ones(n, dtype=np.int32)
    return np.asarray(t)[:n]


def check_draft_compat(target_path: Path | str, draft_path: Path | str,
                       max_vocab_diff: int = MAX_VOCAB_DIFF) -> DraftCompat:
    """Raise IncompatibleDraftError naming the differing property, else describe the pairing."""
    tgt, dft = read_header(target_path), read_header(draft_path)

    t_model, d_model = tgt.get("tokenizer.ggml.model"), dft.get("tokenizer.ggml.model")
    if t_model != d_model:
        raise _fail("tokenizer", t_model, d_model)

    t_tok, d_tok = tgt.get("tokenizer.ggml.tokens"), dft.get("tokenizer.ggml.tokens")
    if t_tok is None or d_tok is None:
        raise IncompatibleDraftError("a model has no tokenizer.ggml.tokens: cannot compare vocabularies.",
                                     "Use GGUF files converted with their tokenizer.")
    nt, nd = len(t_tok), len(d_tok)
    if abs(nt - nd) > max_vocab_diff:
        raise _fail("vocabulary size", nt, nd)

    for key, label in (("tokenizer.ggml.bos_token_id", "BOS token id"),
                       ("tokenizer.ggml.eos_token_id", "EOS token id")):
        a, b = tgt.get(key), dft.get(key)
        if a is not None and b is not None and int(a) != int(b):
            raise _fail(label, int(a), int(b))

    n = min(nt, nd)
    t_texts, d_texts = tgt.strings("tokenizer.ggml.tokens")[:n], dft.strings("tokenizer.ggml.tokens")[:n]
    skip = np.isin(_types(tgt, n), _SKIP_TYPES) | np.isin(_types(dft, n), _SKIP_TYPES)
    compared = 0
    for i in range(n):
        if skip[i]:
            continue
        compared += 1
        if t_texts[i] != d_texts[i]:
            raise _fail(f"token {i}", t_texts[i].decode("utf-8", "replace"), d_texts[i].decode("utf-8", "replace"))
    bos, eos = tgt.get("tokenizer.ggml.bos_token_id"), tgt.get("tokenizer.ggml.eos_token_id")
    return DraftCompat(nt, nd, str(t_model), None if bos is None else int(bos),
                       None if eos is None else int(eos), compared)
