"""Tiny, valid GGUF files for tests, written with gguf.GGUFWriter (kilobytes, not gigabytes)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
from gguf import GGUFValueType, GGUFWriter, LlamaFileType, TokenType

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
    name: str | None = None,
) -> Path:
    tokens = list(BASE_TOKENS if tokens is None else tokens)
    if token_types is None:
        token_types = [int(TokenType.CONTROL) if t.startswith("<") else int(TokenType.NORMAL) for t in tokens]
    w = GGUFWriter(str(path), arch)
    w.add_name(f"tiny {arch}" if name is None else name)
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


def make_lora_gguf(
    path: Path,
    *,
    arch: str = "llama",
    targets: dict[str, tuple[int, int]] | None = None,
    rank: int = 2,
    general_type: str = "adapter",
    adapter_type: str = "lora",
    transposed: bool = False,
    n_embd: int | None = None,
    std: float = 0.0,
    seed: int = 0,
) -> Path:
    """A LoRA adapter GGUF as llama.cpp's convert_lora_to_gguf.py writes one.

    ``targets`` maps base tensor names to their GGUF shape (ne0, ne1); each gets ``.lora_a``
    with shape (ne0, rank) and ``.lora_b`` with shape (rank, ne1). ``transposed`` swaps lora_a's
    axes, the classic mistake llama.cpp refuses. ``n_embd`` writes ``<arch>.embedding_length``.
    The weights are zeros (a no-op adapter), or with ``std`` > 0 normal noise of that deviation in
    both halves, so that the delta B @ A (times alpha / rank = 1) changes what the model says.
    """
    rng = np.random.default_rng(seed)

    def weights(shape: tuple[int, int]) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32) if std else np.zeros(shape, np.float32)

    targets = targets if targets is not None else {"blk.0.attn_q.weight": (16, 16)}
    w = GGUFWriter(str(path), arch)
    w.add_type(general_type)
    w.add_string("adapter.type", adapter_type)
    w.add_float32("adapter.lora.alpha", float(rank))
    if n_embd is not None:
        w.add_embedding_length(n_embd)
    for name, (ne0, ne1) in targets.items():
        a_shape = (ne0, rank) if transposed else (rank, ne0)  # numpy shape is ne reversed
        w.add_tensor(f"{name}.lora_a", weights(a_shape))
        w.add_tensor(f"{name}.lora_b", weights((ne1, rank)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def synthetic_lora(base: Path, out: Path, *, std: float = 0.05, rank: int = 8, seed: int = 1) -> Path:
    """A random rank-r LoRA on every layer's attention query and value projections of the model
    file `base`, shaped from its header: on the Qwen2.5 0.5B and 1.5B, std 0.05 changes the greedy
    answer and keeps it fluent (0.1 makes it gibberish)."""
    from localspec.models.gguf_info import read_header

    meta = read_header(base)
    targets = {t.name: (t.shape[0], t.shape[1]) for t in meta.tensors
               if t.name.startswith("blk.") and t.name.endswith((".attn_q.weight", ".attn_v.weight"))}
    return make_lora_gguf(out, arch=str(meta.get("general.architecture")), targets=targets, rank=rank, std=std,
                          seed=seed)


# ---------------------------------------------------------------- hand-built (crafted) headers
#
# GGUFWriter refuses to write most malformed files, so the crafted-header tests assemble the
# bytes themselves: magic, version, counts, key/values, tensor infos, padding, data.

GGUF_V3 = 3
ALIGN = 32


def g_str(s: str | bytes, length: int | None = None) -> bytes:
    """A GGUF string: u64 length then bytes; ``length`` may lie about the size."""
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(raw) if length is None else length) + raw


def g_kv(key: str, vtype: int, payload: bytes) -> bytes:
    return g_str(key) + struct.pack("<I", vtype) + payload


def g_kv_str(key: str, value: str) -> bytes:
    return g_kv(key, int(GGUFValueType.STRING), g_str(value))


def g_kv_u32(key: str, value: int) -> bytes:
    return g_kv(key, int(GGUFValueType.UINT32), struct.pack("<I", value))


def g_kv_i32(key: str, value: int) -> bytes:
    return g_kv(key, int(GGUFValueType.INT32), struct.pack("<i", value))


def g_array(item_type: int, count: int, items: bytes = b"") -> bytes:
    """An ARRAY value's payload (after the key and the ARRAY type tag)."""
    return struct.pack("<IQ", item_type, count) + items


def g_nested_arrays(depth: int) -> bytes:
    """An ARRAY of ARRAY of … ``depth`` levels, the innermost empty."""
    arr = int(GGUFValueType.ARRAY)
    payload = g_array(int(GGUFValueType.UINT8), 0)
    for _ in range(depth - 1):
        payload = struct.pack("<IQ", arr, 1) + payload
    return payload


def g_tensor(name: str, dims: tuple[int, ...], ggml_type: int = 0, offset: int = 0) -> bytes:
    return g_str(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims) \
        + struct.pack("<IQ", ggml_type, offset)


def crafted_gguf(
    path: Path,
    kvs: list[bytes],
    tensors: list[bytes] | None = None,
    *,
    n_kv: int | None = None,
    n_tensors: int | None = None,
    data: bytes = b"",
    size: int | None = None,
) -> Path:
    """Header + key/values + tensor infos, padded to ALIGN, then ``data``; ``size`` pads with zeros.

    ``n_kv``/``n_tensors`` override the counts written in the header (they may lie).
    """
    tensors = tensors or []
    body = struct.pack("<4sIQQ", b"GGUF", GGUF_V3, len(tensors) if n_tensors is None else n_tensors,
                       len(kvs) if n_kv is None else n_kv)
    body += b"".join(kvs) + b"".join(tensors)
    body += b"\0" * (-len(body) % ALIGN) + data
    if size is not None:
        body = body[:size] + b"\0" * max(0, size - len(body))
    Path(path).write_bytes(body)
    return Path(path)


LLAMA_KV = [g_kv_str("general.architecture", "llama")]
F32_4x4 = g_tensor("blk.0.attn_q.weight", (4, 4), 0, 0)  # 64 bytes of data
