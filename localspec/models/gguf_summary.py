"""A GGUF file's summary (`models info`, the fit check, the Hub's header reads): architecture, size,
quantisation, context and KV geometry, from a header `gguf_info` has parsed and checked."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf import LlamaFileType

from localspec.models.gguf_info import GGUFMeta, is_int, read_header


@dataclass(frozen=True)
class GGUFInfo:
    path: Path
    file_size: int
    version: int
    architecture: str
    name: str | None
    file_type: int | None
    quant: str | None
    parameters: int
    context_length: int | None
    embedding_length: int | None
    block_count: int | None
    head_count: int | None
    head_count_kv: int | None
    key_length: int | None
    value_length: int | None
    vocab_size: int | None
    tokenizer_model: str | None
    bos_token_id: int | None
    eos_token_id: int | None
    has_chat_template: bool
    n_tensors: int
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def kv_bytes_per_token(self, bytes_per_value: int = 2) -> int | None:
        """KV-cache bytes per context position (f16 by default), all layers."""
        if not (self.block_count and self.head_count_kv and self.key_length and self.value_length):
            return None
        return self.block_count * self.head_count_kv * (self.key_length + self.value_length) * bytes_per_value

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "extra"}
        d["path"] = str(self.path)
        return d


def quant_name(file_type: int | None) -> str | None:
    if file_type is None:
        return None
    try:
        name = LlamaFileType(file_type).name
    except ValueError:
        return f"type {file_type}"
    return {"ALL_F32": "F32", "GUESSED": None}.get(name, name.removeprefix("MOSTLY_"))


def _int(v: Any) -> int | None:
    """A scalar integer key's value; None when absent or per-layer (an array)."""
    return v if is_int(v) else None


def info_from_meta(meta: GGUFMeta) -> GGUFInfo:
    arch = meta.get("general.architecture") or "unknown"  # only a split model's later shards lack it
    g = lambda key: meta.get(f"{arch}.{key}")  # noqa: E731
    n_embd, n_head = _int(g("embedding_length")), _int(g("attention.head_count"))
    n_head_kv = _int(g("attention.head_count_kv")) or n_head
    head_dim = n_embd // n_head if n_embd and n_head else None
    tokens = meta.get("tokenizer.ggml.tokens")
    ft = _int(meta.get("general.file_type"))
    return GGUFInfo(
        path=meta.path,
        file_size=meta.file_size,
        version=meta.version,
        architecture=arch,
        name=meta.get("general.name"),
        file_type=ft,
        quant=quant_name(ft),
        parameters=sum(t.n_elements for t in meta.tensors),
        context_length=_int(g("context_length")),
        embedding_length=n_embd,
        block_count=_int(g("block_count")),
        head_count=n_head,
        head_count_kv=n_head_kv,
        key_length=_int(g("attention.key_length")) or head_dim,
        value_length=_int(g("attention.value_length")) or head_dim,
        vocab_size=len(tokens) if tokens is not None else None,
        tokenizer_model=meta.get("tokenizer.ggml.model"),
        bos_token_id=_int(meta.get("tokenizer.ggml.bos_token_id")),
        eos_token_id=_int(meta.get("tokenizer.ggml.eos_token_id")),
        has_chat_template=bool(meta.get("tokenizer.chat_template")),
        n_tensors=len(meta.tensors),
    )


def read_gguf_info(path: Path | str) -> GGUFInfo:
    """Validate and summarise a GGUF file (no weights are read)."""
    return info_from_meta(read_header(path))
