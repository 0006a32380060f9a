"""Tiny, valid GGUF files for tests, written with gguf.GGUFWriter (kilobytes, not gigabytes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter, LlamaFileType, TokenType

BASE_TOKENS = ["<unk>", "<s>", "</s>"] + [f"tok{i}" for i in range(3, 64)]


def make_gguf(
    path: Path,
    *,
    arch: str = "llama",
    tokens: list[str] | None = None,
    token_types: list[int] | None = None,
    tokenizer: str = "llama",
    bos: int | None = 1,
    eos: int | None = 2,
    n_layers: int = 2,
    n_embd: int = 16,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ctx: int = 256,
    chat_template: str | None = "{{ messages }}",
    seed: int = 0,
    pad_floats: int = 0,
) -> Path:
    tokens = list(BASE_TOKENS if tokens is None else tokens)
    if token_types is None:
        token_types = [int(TokenType.CONTROL) if t.startswith("<") else int(TokenType.NORMAL) for t in tokens]
    w = GGUFWriter(str(path), arch)
    w.add_name(f"tiny {arch}")
    w.add_context_length(n_ctx)
    w.add_block_count(n_layers)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_embd * 2)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_file_type(int(LlamaFileType.ALL_F32))
    w.add_tokenizer_model(tokenizer)
    w.add_token_list(tokens)
    w.add_token_types(token_types)
    if bos is not None:
        w.add_bos_token_id(bos)
    if eos is not None:
        w.add_eos_token_id(eos)
    if chat_template:
        w.add_chat_template(chat_template)
    rng = np.random.default_rng(seed)
    w.add_tensor("token_embd.weight", rng.standard_normal((len(tokens), n_embd), dtype=np.float32))
    for i in range(n_layers):
        w.add_tensor(f"blk.{i}.attn_q.weight", rng.standard_normal((n_embd, n_embd), dtype=np.float32))
    if pad_floats:  # bulk, for tests that need a file of several megabytes
        w.add_tensor("pad.weight", np.zeros(pad_floats, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def n_params(n_tokens: int = len(BASE_TOKENS), n_embd: int = 16, n_layers: int = 2) -> int:
    return n_tokens * n_embd + n_layers * n_embd * n_embd
