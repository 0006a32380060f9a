"""Write random-weight Qwen2 GGUF files with the exact tensor shapes of a real model.

The GPU cost check cannot ship real weights (the 0.5B alone is 491 MB; the bundle limit is
60 MiB), and a forward pass costs the same whatever the weights are. So the quantized blocks are
random bytes in the layout of each ggml type, with the fp16 scales pinned so every weight is
small, finite and roughly zero-mean (activations stay finite over 28 layers). gguf-py can
dequantize Q4_K/Q6_K but not quantize them, and quantizing 7.6e9 float weights in numpy would
take longer than the whole check is allowed, so the blocks are generated directly.

The type mix follows llama.cpp's Q4_K_M recipe closely enough for cost purposes: Q4_K for most
matrices, Q6_K for the output and for attn_v/ffn_down in the "more bits" layers, and the legacy
32-wide fallbacks (Q5_0 / Q8_0) where a row is not a multiple of 256 (the 0.5B's 896).
The tokenizer comes from a vocab-only GGUF (llama.cpp's models/ggml-vocab-qwen2.gguf), padded
with [PADn] tokens to the model's embedding rows, as the HF converter does.

Random weights alone give flat logits: top two within a float rounding of each other, so a verify
pass's size flips the argmax, answers part after a few tokens, and a prediction of the model's
own answer is not kept whole. With a word chain (`successors`), the embedding and output matrices
are written as sign patterns instead, so that the greedy next token after a word on the chain is
its successor by a wide margin: token t's embedding row is a random +-EMBED_AMP sign vector and the
output row of successor(t) is the same signs, so their dot product (~n_embd) stands many standard
deviations above every other row's (~sqrt(n_embd)), even where the random layers' part of the
residual outweighs the embedding (~40 against 8 per entry on the 7B shape: a 14-logit lead). The chain runs
through plain words (" word": one token that tokenizes back to itself) in cycles, so text repeats
(prompt lookup finds it) and a prediction round-trips; a draft written with `disagree` follows a
chosen fraction of the same successors (its acceptance). The cost is unchanged: same types, shapes
and bytes.

Usage: python synth_gguf.py OUT.gguf --shape qwen2.5-coder-7b --vocab ggml-vocab-qwen2.gguf
"""

from __future__ import annotations

import argparse
import mmap
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np


def _import_gguf():
    """gguf-py imports PyYAML only for model-card metadata, which this writer never touches."""
    try:
        import yaml  # noqa: F401
    except ImportError:
        import types

        sys.modules["yaml"] = types.ModuleType("yaml")  # a GPU box may lack PyYAML; nothing here uses it
    import gguf

    return gguf


gguf = _import_gguf()
Q = gguf.GGMLQuantizationType


@dataclass(frozen=True)
class ModelShape:
    name: str
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx_train: int = 32768
    rope_base: float = 1_000_000.0
    rms_eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def n_params(self) -> int:
        kv = self.head_dim * self.n_head_kv
        per_layer = 2 * self.n_embd * self.n_embd + 2 * self.n_embd * kv + 3 * self.n_embd * self.n_ff
        return self.n_layer * per_layer + 2 * self.n_vocab * self.n_embd


# From the models' config.json (Qwen2.5-Coder-7B-Instruct, Qwen2.5-Coder-0.5B-Instruct).
SHAPES = {
    "qwen2.5-coder-7b": ModelShape("qwen2.5-coder-7b", 152064, 3584, 28, 28, 4, 18944),
    "qwen2.5-coder-1.5b": ModelShape("qwen2.5-coder-1.5b", 151936, 1536, 28, 12, 2, 8960),
    "qwen2.5-coder-0.5b": ModelShape("qwen2.5-coder-0.5b", 151936, 896, 24, 14, 2, 4864),
    # --small rehearsal shapes: the real vocabulary (the tokenizer needs it), tiny layers. The
    # draft's 192-wide rows are not a multiple of 256, so the Q5_0/Q8_0 fallbacks are exercised.
    "small-target": ModelShape("small-target", 151936, 256, 4, 4, 2, 768, n_ctx_train=4096),
    "small-draft": ModelShape("small-draft", 151936, 192, 2, 3, 1, 512, n_ctx_train=4096),
    "small-second": ModelShape("small-second", 151936, 128, 2, 2, 1, 384, n_ctx_train=4096),  # the 1.5B's stand-in
}

# Per type: (offset, value) of each fp16 scale in a block. The other bytes are random quants;
# the values give weights of std ~0.015 and mean ~0 (see the module docstring).
_SCALES: dict[int, tuple[tuple[int, float], ...]] = {
    Q.Q4_K: ((0, 1e-4), (2, 7.5e-4)),  # d, dmin: w = d*sc*q - dmin*m; E[q]=7.5 so dmin = 7.5 d
    Q.Q6_K: ((208, 1e-5),),  # d after ql, qh and int8 scales: w = d*sc*(q-32)
    Q.Q5_0: ((0, 1.5e-3),),  # w = d*(q-16)
    Q.Q8_0: ((0, 2e-4),),  # w = d*q
}
_FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q6_K: Q.Q8_0}  # rows not a multiple of 256, as llama-quantize does


def _more_bits(layer: int, n_layer: int) -> bool:
    """Q4_K_M's choice of layers whose attn_v/ffn_down get Q6_K."""
    eighth = n_layer // 8
    return layer < eighth or layer >= 7 * eighth or (layer - eighth) % 3 == 2


def tensor_plan(shape: ModelShape, recipe: str = "q4_k_m") -> list[tuple[str, tuple[int, ...], int]]:
    """(name, numpy shape (rows, row_length), ggml type) of every tensor, in file order."""
    e, kv = shape.n_embd, shape.head_dim * shape.n_head_kv

    def mat(kind: int, rows: int, cols: int) -> int:
        if recipe == "q8_0":
            kind = Q.Q8_0
        block = gguf.GGML_QUANT_SIZES[kind][0]
        if cols % block:
            kind = _FALLBACK.get(kind, kind)
        if cols % gguf.GGML_QUANT_SIZES[kind][0]:
            raise ValueError(f"row length {cols} does not fit {kind.name} blocks")
        return kind

    plan: list[tuple[str, tuple[int, ...], int]] = [
        ("token_embd.weight", (shape.n_vocab, e), mat(Q.Q4_K, shape.n_vocab, e)),
        ("output_norm.weight", (e,), Q.F32),
        ("output.weight", (shape.n_vocab, e), mat(Q.Q6_K, shape.n_vocab, e)),
    ]
    for i in range(shape.n_layer):
        big = Q.Q6_K if _more_bits(i, shape.n_layer) else Q.Q4_K
        b = f"blk.{i}."
        plan += [
            (b + "attn_norm.weight", (e,), Q.F32),
            (b + "attn_q.weight", (e, e), mat(Q.Q4_K, e, e)),
            (b + "attn_q.bias", (e,), Q.F32),
            (b + "attn_k.weight", (kv, e), mat(Q.Q4_K, kv, e)),
            (b + "attn_k.bias", (kv,), Q.F32),
            (b + "attn_v.weight", (kv, e), mat(big, kv, e)),
            (b + "attn_v.bias", (kv,), Q.F32),
            (b + "attn_output.weight", (e, e), mat(Q.Q4_K, e, e)),
            (b + "ffn_norm.weight", (e,), Q.F32),
            (b + "ffn_gate.weight", (shape.n_ff, e), mat(Q.Q4_K, shape.n_ff, e)),
            (b + "ffn_up.weight", (shape.n_ff, e), mat(Q.Q4_K, shape.n_ff, e)),
            (b + "ffn_down.weight", (e, shape.n_ff), mat(big, e, shape.n_ff)),
        ]
    return plan


def _byte_shape(shape: tuple[int, ...], kind: int) -> tuple[int, ...]:
    block, size = gguf.GGML_QUANT_SIZES[kind]
    return (*shape[:-1], shape[-1] // block * size)


def random_blocks(kind: int, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random quantized data of `shape` weights, as the uint8 byte array gguf's writer takes."""
    block, size = gguf.GGML_QUANT_SIZES[kind]
    n_blocks = int(np.prod(shape)) // block
    raw = np.frombuffer(rng.bytes(n_blocks * size), dtype=np.uint8).reshape(n_blocks, size).copy()
    for offset, value in _SCALES[kind]:
        raw[:, offset : offset + 2] = np.frombuffer(np.float16(value).tobytes(), dtype=np.uint8)
    if kind == Q.Q4_K:
        # Each sub-block's min equal to its scale (the 6-bit pairs packed alike), so with dmin = 7.5 d
        # every 32 weights average zero: random pairs would give each a constant offset, and 28
        # layers of such offsets add up to one direction that outweighs the embedding.
        raw[:, 8:12] = raw[:, 4:8]  # j < 4: scale and min in the low 6 bits of bytes 4+j and 8+j
        raw[:, 12:16] = (raw[:, 12:16] & 0x0F) * 0x11  # j >= 4: low nibble scale, high nibble min
    return raw.reshape(_byte_shape(shape, kind))


# ---------------------------------------------------------------- the word chain

EMBED_AMP = 8.0  # embedding entries +-8; the layers add ~3 per entry on the 0.5B shape, ~40 on the 7B
OUTPUT_LOGIT_SCALE = 2.0  # output rows +-2/sqrt(n_embd): a non-successor's logit has std ~2


def word_ids(tokens: list[str]) -> np.ndarray:
    """Ids of plain words: a space then 3+ lowercase ASCII letters ("Ġword" in byte-level BPE)."""
    import re

    word = re.compile(r"^\u0120[a-z]{3,}$")
    return np.array([i for i, t in enumerate(tokens) if word.match(t)], dtype=np.int64)


def successors(ids: np.ndarray, n_vocab: int, *, cycle: int, seed: int = 0) -> np.ndarray:
    """successor[t] for every token: the next word on the chain for t in `ids`, -1 for the rest.

    The shuffled ids are cut into cycles of `cycle` words (the last one takes the remainder), so
    the successor is a permutation of `ids` and an answer repeats after `cycle` tokens."""
    if len(ids) < 2 * cycle:
        raise ValueError(f"{len(ids)} words cannot make cycles of {cycle}")
    order = np.random.default_rng(seed).permutation(ids)
    succ = np.full(n_vocab, -1, dtype=np.int64)
    starts = list(range(0, len(order) - len(order) % cycle, cycle))
    for a, b in zip(starts, [*starts[1:], len(order)], strict=True):
        ring = order[a:b]
        succ[ring] = np.roll(ring, -1)
    return succ


def disagree(succ: np.ndarray, fraction: float, *, seed: int = 1) -> np.ndarray:
    """A copy of `succ` whose successors differ for `fraction` of the chain's words (rotated among
    those words, so it stays a permutation): a draft that agrees with the target on the rest."""
    out = succ.copy()
    on_chain = np.flatnonzero(succ >= 0)
    picked = np.random.default_rng(seed).choice(on_chain, size=int(round(fraction * len(on_chain))), replace=False)
    if len(picked) > 1:
        out[picked] = np.roll(succ[picked], 1)
    return out


def sign_blocks(kind: int, signs: np.ndarray, amplitude: np.ndarray | float) -> np.ndarray:
    """Rows of +-amplitude (per row; 0 gives a zero row) encoded exactly in ggml type `kind`.

    signs: bool (rows, cols), True for +. Each type's layout is ggml's (dequantize_row_*):
    Q8_0  d, int8 q[32]                      w = d*q,           q = +-127
    Q5_0  d, qh (bit i: weight i's 5th bit), qs[16] (weights j, j+16)   w = d*(q-16), q = 31 | 1
    Q4_K  d, dmin, 12 bytes of 6-bit scale/min pairs (all 1), qs[128]: per 64 weights, 32 bytes
          holding weights l (low nibble) and l+32 (high)   w = d*q - dmin, q = 15 | 0, dmin = 7.5 d
    Q6_K  ql[128], qh[64], int8 scales[16] (all 1), d: per 128 weights, ql[l] = weights l | l+64,
          ql[l+32] = l+32 | l+96, qh[l] = the top 2 bits of l, l+32, l+64, l+96   w = d*(q-32), q = 63 | 1
    """
    block, size = gguf.GGML_QUANT_SIZES[kind]
    rows, cols = signs.shape
    nb = cols // block
    s = signs.reshape(rows, nb, block)
    amp = np.broadcast_to(np.asarray(amplitude, dtype=np.float32).reshape(-1, 1), (rows, nb))
    out = np.zeros((rows, nb, size), dtype=np.uint8)

    def f16(values: np.ndarray) -> np.ndarray:
        return values.astype(np.float16).view(np.uint8).reshape(rows, nb, 2)

    if kind == Q.Q8_0:
        out[..., 0:2] = f16(amp / 127)
        out[..., 2:] = np.where(s, 127, -127).astype(np.int8).view(np.uint8)
    elif kind == Q.Q5_0:
        q = np.where(s, 31, 1).astype(np.uint8)
        out[..., 0:2] = f16(amp / 15)
        bits = (q >> 4).astype(np.uint32) << np.arange(32, dtype=np.uint32)
        out[..., 2:6] = np.bitwise_or.reduce(bits, axis=-1).astype("<u4").view(np.uint8).reshape(rows, nb, 4)
        out[..., 6:] = (q[..., :16] & 0xF) | ((q[..., 16:] & 0xF) << 4)
    elif kind == Q.Q4_K:
        q = np.where(s, 15, 0).astype(np.uint8).reshape(rows, nb, 4, 2, 32)  # 4 x (low 32, high 32)
        out[..., 0:2] = f16(amp * 2 / 15)
        out[..., 2:4] = f16(amp)
        out[..., 4:12] = 1
        out[..., 12:16] = 0x11
        out[..., 16:] = (q[..., 0, :] | (q[..., 1, :] << 4)).reshape(rows, nb, 128)
    elif kind == Q.Q6_K:
        q = np.where(s, 63, 1).astype(np.uint8).reshape(rows, nb, 2, 4, 32)  # 2 halves x 4 quarters
        low, high = q & 0xF, q >> 4
        ql = np.concatenate([low[..., 0, :] | (low[..., 2, :] << 4), low[..., 1, :] | (low[..., 3, :] << 4)], axis=-1)
        qh = high[..., 0, :] | (high[..., 1, :] << 2) | (high[..., 2, :] << 4) | (high[..., 3, :] << 6)
        out[..., 0:128] = ql.reshape(rows, nb, 128)
        out[..., 128:192] = qh.reshape(rows, nb, 64)
        out[..., 192:208] = 1
        out[..., 208:210] = f16(amp / 31)
    else:
        raise ValueError(f"no sign encoding for {Q(kind).name}")
    return out.reshape(rows, nb * size)


def chain_matrices(kind_embd: int, kind_out: int, shape: ModelShape, succ: np.ndarray,
                   rng: np.random.Generator, rows_per_chunk: int = 8192) -> tuple[np.ndarray, np.ndarray]:
    """token_embd and output as encoded bytes: random signs for every token's embedding; output
    row successor(t) = t's signs for t on the chain, zero rows for tokens no word leads to."""
    n, e = shape.n_vocab, shape.n_embd
    packed = np.frombuffer(rng.bytes(n * e // 8), dtype=np.uint8).reshape(n, e // 8)
    out_packed = np.zeros_like(packed)
    on_chain = np.flatnonzero(succ[:n] >= 0)
    out_packed[succ[on_chain]] = packed[on_chain]
    out_amp = np.zeros(n, dtype=np.float32)
    out_amp[succ[on_chain]] = OUTPUT_LOGIT_SCALE / np.sqrt(e)
    embd = np.empty(_byte_shape((n, e), kind_embd), dtype=np.uint8)
    output = np.empty(_byte_shape((n, e), kind_out), dtype=np.uint8)
    for a in range(0, n, rows_per_chunk):
        b = min(a + rows_per_chunk, n)
        embd[a:b] = sign_blocks(kind_embd, np.unpackbits(packed[a:b], axis=1).astype(bool), EMBED_AMP)
        output[a:b] = sign_blocks(kind_out, np.unpackbits(out_packed[a:b], axis=1).astype(bool), out_amp[a:b])
    return embd, output


_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_kv(path: Path) -> dict[str, tuple[int, int | None, object]]:
    """The key/values of a GGUF file as {key: (value type, array item type, value)}.

    A small parser of its own: gguf-py's GGUFReader builds a numpy view per string and takes
    ~10 s for a 150k-token vocabulary; this reads it in well under a second. The file is mapped,
    so a full model file works too (only its header pages are read).
    """
    with open(path, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if data[:4] != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    (version,) = struct.unpack_from("<I", data, 4)
    if version < 2:
        raise ValueError(f"{path}: GGUF version {version} is too old")
    n_kv = struct.unpack_from("<Q", data, 16)[0]
    pos = 24

    def string() -> str:
        nonlocal pos
        (n,) = struct.unpack_from("<Q", data, pos)
        pos += 8 + n
        return bytes(data[pos - n : pos]).decode("utf-8", errors="surrogateescape")

    def value(vtype: int) -> object:
        nonlocal pos
        if vtype == 8:
            return string()
        fmt = _SCALAR[vtype]
        (v,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v

    out: dict[str, tuple[int, int | None, object]] = {}
    for _ in range(n_kv):
        key = string()
        (vtype,) = struct.unpack_from("<I", data, pos)
        pos += 4
        if vtype == 9:
            sub, n = struct.unpack_from("<IQ", data, pos)
            pos += 12
            if sub == 8:
                out[key] = (vtype, sub, [string() for _ in range(n)])
            else:
                fmt = f"<{n}{_SCALAR[sub][1]}"
                out[key] = (vtype, sub, list(struct.unpack_from(fmt, data, pos)))
                pos += struct.calcsize(fmt)
        else:
            out[key] = (vtype, None, value(vtype))
    data.close()
    return out


def tokenizer_fields(vocab_path: Path, n_vocab: int) -> list[tuple[str, object, object, object]]:
    """tokenizer.* key/values of a vocab-only GGUF, tokens padded to n_vocab with [PADn]."""
    out = []
    for key, (vtype, sub, value) in read_kv(vocab_path).items():
        if not key.startswith("tokenizer."):
            continue
        if key == "tokenizer.ggml.tokens":
            if len(value) > n_vocab:
                raise ValueError(f"{vocab_path} has {len(value)} tokens, more than the model's {n_vocab}")
            value = value + [f"[PAD{i}]" for i in range(len(value), n_vocab)]
        elif key == "tokenizer.ggml.token_type":
            value = value + [int(gguf.TokenType.UNUSED)] * (n_vocab - len(value))
        out.append((key, value, gguf.GGUFValueType(vtype), None if sub is None else gguf.GGUFValueType(sub)))
    if not any(k == "tokenizer.ggml.tokens" for k, *_ in out):
        raise ValueError(f"{vocab_path} has no tokenizer.ggml.tokens")
    return out


def write_random_gguf(path: Path, shape: ModelShape, vocab_path: Path, recipe: str = "q4_k_m", seed: int = 0,
                      *, successor: np.ndarray | None = None) -> dict:
    """Write the model; return a summary (bytes, seconds, type counts). One tensor in memory at a
    time, but for the embedding and output matrices of a word chain (`successor`, see the module
    docstring), made together."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    plan = tensor_plan(shape, recipe)
    kinds = {name: kind for name, _, kind in plan}
    chained: dict[str, np.ndarray] = {}
    if successor is not None:
        if len(successor) < shape.n_vocab:
            raise ValueError(f"a successor for {len(successor)} tokens, the model has {shape.n_vocab}")
        chained["token_embd.weight"], chained["output.weight"] = chain_matrices(
            kinds["token_embd.weight"], kinds["output.weight"], shape, successor, rng)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name(f"random {shape.name} ({recipe}) for cost checks")
    w.add_context_length(shape.n_ctx_train)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_rope_freq_base(shape.rope_base)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if recipe == "q8_0" else gguf.LlamaFileType.MOSTLY_Q4_K_M)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, value, vtype, sub in tokenizer_fields(vocab_path, shape.n_vocab):
        w.add_key_value(key, value, vtype, sub_type=sub)
    for name, shp, kind in plan:
        if kind == Q.F32:
            w.add_tensor_info(name, shp, np.dtype(np.float32), int(np.prod(shp)) * 4)
        else:
            bshape = _byte_shape(shp, kind)
            w.add_tensor_info(name, bshape, np.dtype(np.uint8), int(np.prod(bshape)), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    # Equal shapes and types get the same random bytes: the cost does not depend on the values,
    # and generating 4+ GB of random numbers would take a good part of the time budget.
    made: dict[tuple, np.ndarray] = {}
    counts: dict[str, int] = {}
    for name, shp, kind in plan:
        data: np.ndarray
        if kind == Q.F32:
            data = np.ones(shp, np.float32) if name.endswith("norm.weight") else np.zeros(shp, np.float32)
        elif name in chained:
            data = chained.pop(name)
        else:
            if (shp, kind) not in made:
                made[(shp, kind)] = random_blocks(kind, shp, rng)
            data = made[(shp, kind)]
        w.write_tensor_data(data)
        counts[Q(kind).name] = counts.get(Q(kind).name, 0) + 1
    w.close()
    return {"path": str(path), "shape": shape.name, "recipe": recipe, "n_params": shape.n_params(),
            "bytes": path.stat().st_size, "seconds": round(time.perf_counter() - t0, 2), "types": counts,
            "word_chain": successor is not None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--vocab", type=Path, required=True, help="vocab-only GGUF (ggml-vocab-qwen2.gguf)")
    ap.add_argument("--recipe", choices=("q4_k_m", "q8_0"), default="q4_k_m")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    info = write_random_gguf(args.out, SHAPES[args.shape], args.vocab, args.recipe, args.seed)
    print(info)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
