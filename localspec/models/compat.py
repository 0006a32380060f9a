"""Can this draft model propose tokens for that target, and can this LoRA adapter go on that
model? Both checked from GGUF metadata alone.

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

from localspec.errors import IncompatibleAdapterError, IncompatibleDraftError, IntegrityError
from localspec.models.gguf_info import GGUFMeta, TensorInfo, named_file_error, read_header

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


def _header(model: Path | str | GGUFMeta) -> GGUFMeta:
    return model if isinstance(model, GGUFMeta) else read_header(model)


def check_draft_compat(target_path: Path | str | GGUFMeta, draft_path: Path | str | GGUFMeta,
                       max_vocab_diff: int = MAX_VOCAB_DIFF) -> DraftCompat:
    """Raise IncompatibleDraftError naming the differing property, else describe the pairing.
    Either side may be a header already parsed (a Hub file's, read by range requests)."""
    tgt, dft = _header(target_path), _header(draft_path)

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


# ---------------------------------------------------------------- LoRA adapters

_LORA_SUFFIXES = (".lora_a", ".lora_b")


@dataclass(frozen=True)
class LoraCompat:
    """An adapter that passed check_lora: what it adapts."""

    architecture: str
    n_pairs: int  # adapted base tensors (lora_a/lora_b pairs)
    ranks: tuple[int, ...]  # distinct ranks, ascending


LORA_FILE_FIX = "Check the adapter's path (--lora, or `lora =` in models.toml); it must be a LoRA adapter GGUF."


def _refuse(adapter: Path, reason: str) -> IncompatibleAdapterError:
    return IncompatibleAdapterError(
        f"LoRA adapter {adapter} cannot be used: {reason}.",
        "Use a LoRA GGUF converted for this model (llama.cpp's convert_lora_to_gguf.py with this base), "
        "or leave the adapter out (--lora, or lora_path in settings.toml).",
    )


def _lora_pairs(adapter: Path, meta: GGUFMeta) -> dict[str, tuple[TensorInfo, TensorInfo]]:
    """Base tensor name -> (lora_a, lora_b); refuses a half pair or a foreign tensor."""
    halves: dict[str, dict[str, TensorInfo]] = {}
    for t in meta.tensors:
        suffix = next((s for s in _LORA_SUFFIXES if t.name.endswith(s)), None)
        if suffix is None:
            if t.name.endswith("_norm.weight"):  # llama.cpp copies these as they are
                continue
            raise _refuse(adapter, f"tensor {t.name!r} is neither a lora_a nor a lora_b tensor")
        halves.setdefault(t.name.removesuffix(suffix), {})[suffix] = t
    pairs = {}
    for base, half in halves.items():
        if len(half) != 2:
            raise _refuse(adapter, f"the LoRA pair for {base!r} is missing one of lora_a/lora_b")
        pairs[base] = (half[".lora_a"], half[".lora_b"])
    if not pairs:
        raise _refuse(adapter, "it has no lora_a/lora_b tensors")
    return pairs


def _check_shapes(adapter: Path, pairs: dict[str, tuple[TensorInfo, TensorInfo]], base: GGUFMeta) -> None:
    """The shapes llama.cpp requires, in GGUF order: base (in, out), lora_a (in, r), lora_b (r, out)."""
    base_shapes = {t.name: t.shape for t in base.tensors}
    split = base.get("split.count", 1) > 1  # other shards hold tensors we cannot see here
    for name, (a, b) in pairs.items():
        if len(a.shape) != 2 or len(b.shape) != 2:
            raise _refuse(adapter, f"the LoRA pair for {name!r} is not two matrices")
        shape = base_shapes.get(name)
        if shape is None:
            if split:
                continue
            raise _refuse(adapter, f"the model {base.path.name} has no tensor {name!r} (made for another model?)")
        if len(shape) < 2:
            raise _refuse(adapter, f"the model's tensor {name!r} is not a matrix")
        if name == "token_embd.weight":  # stored transposed; see llama.cpp's input embedding
            fits = shape[0] == b.shape[1] and shape[1] == a.shape[1]
        else:
            fits = shape[0] == a.shape[0] and shape[1] == b.shape[1] and a.shape[1] == b.shape[0]
        if not fits:
            raise _refuse(adapter, f"tensor {name!r} is {shape[0]}x{shape[1]} in the model {base.path.name}, but "
                                   f"the adapter's pair is {a.shape[0]}x{a.shape[1]} and {b.shape[0]}x{b.shape[1]} "
                                   "(made for another model size?)")


def check_lora(adapter_path: Path | str, base_path: Path | str) -> LoraCompat:
    """Refuse an adapter llama.cpp would reject (or abort on): it must be a valid GGUF whose
    general.type is "adapter" and adapter.type "lora", for the base model's architecture, with
    embedding size and tensor shapes that match the base. Reads headers only."""
    adapter = Path(adapter_path)
    if "\0" in str(adapter):  # from settings.toml: open() would raise a bare ValueError
        raise _refuse(adapter, "its path has a NUL byte")
    try:
        meta = read_header(adapter)
    except IntegrityError as exc:
        raise named_file_error(exc, LORA_FILE_FIX) from None
    base = read_header(base_path)  # IntegrityError (pull it again) when the store's model is malformed
    kind, lora = meta.get("general.type"), meta.get("adapter.type")
    if kind != "adapter":
        raise _refuse(adapter, f"its general.type is {kind!r}, not 'adapter' (is it a model, not an adapter?)")
    if lora != "lora":
        raise _refuse(adapter, f"its adapter.type is {lora!r}, not 'lora'")
    arch, base_arch = meta.get("general.architecture"), base.get("general.architecture")
    if arch != base_arch:
        raise _refuse(adapter, f"it is for architecture {arch!r}, the model {base.path.name} is {base_arch!r}")
    n_embd, base_embd = meta.get(f"{arch}.embedding_length"), base.get(f"{arch}.embedding_length")
    if n_embd is not None and base_embd is not None and n_embd != base_embd:
        raise _refuse(adapter, f"its embedding size {n_embd} differs from the model's {base_embd}")
    pairs = _lora_pairs(adapter, meta)
    _check_shapes(adapter, pairs, base)
    return LoraCompat(str(arch), len(pairs), tuple(sorted({a.shape[1] for a, _ in pairs.values()})))
