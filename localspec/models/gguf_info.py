"""GGUF metadata without loading weights, and the validity check that runs before llama.cpp.

gguf.GGUFReader builds a numpy view per array element, which takes ~10 s on a 150k-token vocab
(two such arrays: tokens and merges). This module walks the same header format with ``struct``
over an mmap instead, skipping string arrays by their length prefixes and decoding them only when
asked (``GGUFMeta.strings``), so `models info` stays well under a second. Types and size tables
come from the ``gguf`` package, so new quant types need no change here.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, LlamaFileType

from localspec.errors import IntegrityError

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
MIN_SIZE = 24  # magic + version + tensor count + kv count
DEFAULT_ALIGNMENT = 32

_SCALAR = {
    GGUFValueType.UINT8: ("<B", np.uint8), GGUFValueType.INT8: ("<b", np.int8),
    GGUFValueType.UINT16: ("<H", np.uint16), GGUFValueType.INT16: ("<h", np.int16),
    GGUFValueType.UINT32: ("<I", np.uint32), GGUFValueType.INT32: ("<i", np.int32),
    GGUFValueType.FLOAT32: ("<f", np.float32), GGUFValueType.BOOL: ("<?", np.bool_),
    GGUFValueType.UINT64: ("<Q", np.uint64), GGUFValueType.INT64: ("<q", np.int64),
    GGUFValueType.FLOAT64: ("<d", np.float64),
}


class _Truncated(Exception):
    pass


@dataclass(frozen=True)
class StringArray:
    """A string array left undecoded: where it starts and how many items it has."""

    offset: int  # of the first item's length prefix
    count: int

    def __len__(self) -> int:
        return self.count


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # relative to the data section
    n_elements: int
    n_bytes: int | None  # None for a type this gguf package does not know


@dataclass
class GGUFMeta:
    """The parsed header: key/values, tensor table, and where tensor data starts."""

    path: Path
    version: int
    kv: dict[str, Any]
    tensors: list[TensorInfo]
    data_offset: int
    file_size: int

    def get(self, key: str, default: Any = None) -> Any:
        return self.kv.get(key, default)

    def strings(self, key: str) -> list[bytes]:
        """Decode a string array (e.g. ``tokenizer.ggml.tokens``) as raw bytes per item."""
        arr = self.kv.get(key)
        if not isinstance(arr, StringArray):
            return list(arr or [])
        out: list[bytes] = []
        unpack = struct.Struct("<Q").unpack_from
        with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            pos = arr.offset
            for _ in range(arr.count):
                (n,) = unpack(mm, pos)
                pos += 8
                out.append(mm[pos:pos + n])
                pos += n
        return out


class _Reader:
    def __init__(self, buf: mmap.mmap, size: int) -> None:
        self.buf, self.size, self.pos = buf, size, 0

    def need(self, n: int) -> None:
        if n < 0 or self.pos + n > self.size:
            raise _Truncated(f"header is cut off at byte {self.size} (needed {self.pos + n})")

    def unpack(self, fmt: str, n: int) -> Any:
        self.need(n)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v

    def u32(self) -> int:
        return self.unpack("<I", 4)

    def u64(self) -> int:
        return self.unpack("<Q", 8)

    def raw_str(self) -> bytes:
        n = self.u64()
        self.need(n)
        s = self.buf[self.pos:self.pos + n]
        self.pos += n
        return s

    def value(self, vtype: int) -> Any:
        t = GGUFValueType(vtype)
        if t == GGUFValueType.STRING:
            return self.raw_str().decode("utf-8", errors="replace")
        if t in _SCALAR:
            fmt, _ = _SCALAR[t]
            return self.unpack(fmt, struct.calcsize(fmt))
        if t == GGUFValueType.ARRAY:
            itype = GGUFValueType(self.u32())
            count = self.u64()
            if itype == GGUFValueType.STRING:
                start = self.pos
                unpack = struct.Struct("<Q").unpack_from
                pos, size, buf = self.pos, self.size, self.buf
                for _ in range(count):  # skip items by their length prefixes
                    if pos + 8 > size:
                        raise _Truncated(f"header is cut off at byte {size}")
                    (n,) = unpack(buf, pos)
                    pos += 8 + n
                if pos > size:
                    raise _Truncated(f"header is cut off at byte {size}")
                self.pos = pos
                return StringArray(start, count)
            if itype in _SCALAR:
                fmt, dtype = _SCALAR[itype]
                nbytes = struct.calcsize(fmt) * count
                self.need(nbytes)
                arr = np.frombuffer(self.buf, dtype=np.dtype(dtype).newbyteorder("<"), count=count,
                                    offset=self.pos).copy()
                self.pos += nbytes
                return arr
            return [self.value(itype) for _ in range(count)]  # nested arrays: rare, small
        raise ValueError(f"unknown metadata value type {vtype}")


def _invalid(path: Path, reason: str) -> IntegrityError:
    return IntegrityError(
        f"{path} is not a valid GGUF file: {reason}.",
        "Delete it and pull the model again (`localspec models pull ID`), or re-export the GGUF.",
    )


def _check_preamble(path: Path) -> int:
    """Existence, size, magic and version: cheap checks before any parsing."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise _invalid(path, "no such file") from None
    except OSError as exc:
        raise _invalid(path, f"cannot read it ({exc.strerror})") from None
    if not path.is_file():
        raise _invalid(path, "not a regular file")
    if size <= MIN_SIZE:
        raise _invalid(path, f"only {size} bytes (empty or truncated)")
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:4] != MAGIC:
        raise _invalid(path, f"bad magic {head[:4]!r} (expected b'GGUF')")
    (version,) = struct.unpack("<I", head[4:8])
    if version not in SUPPORTED_VERSIONS:
        swapped = struct.unpack(">I", head[4:8])[0]
        if swapped in SUPPORTED_VERSIONS:
            raise _invalid(path, "big-endian GGUF, which this build cannot load")
        raise _invalid(path, f"unsupported GGUF version {version} (supported: 2, 3)")
    return size


def read_header(path: Path | str) -> GGUFMeta:
    """Parse and validate the header and tensor table; raises IntegrityError when invalid."""
    path = Path(path)
    size = _check_preamble(path)
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            r = _Reader(mm, size)
            r.pos = 4
            version = r.u32()
            n_tensors, n_kv = r.u64(), r.u64()
            if n_tensors > 1_000_000 or n_kv > 1_000_000:
                raise _Truncated(f"implausible counts ({n_tensors} tensors, {n_kv} keys)")
            kv: dict[str, Any] = {}
            for _ in range(n_kv):
                key = r.raw_str().decode("utf-8", errors="replace")
                kv[key] = r.value(r.u32())
            tensors = []
            for _ in range(n_tensors):
                name = r.raw_str().decode("utf-8", errors="replace")
                n_dims = r.u32()
                if n_dims > 8:
                    raise _Truncated(f"tensor {name!r} claims {n_dims} dimensions")
                dims = tuple(r.u64() for _ in range(n_dims))
                gtype = r.u32()
                offset = r.u64()
                n_el = int(np.prod(dims, dtype=np.uint64)) if dims else 1
                try:
                    block, tsize = GGML_QUANT_SIZES[GGMLQuantizationType(gtype)]
                    nbytes: int | None = n_el * tsize // block
                except (ValueError, KeyError):
                    nbytes = None
                tensors.append(TensorInfo(name, dims, gtype, offset, n_el, nbytes))
            align = int(kv.get("general.alignment", DEFAULT_ALIGNMENT) or DEFAULT_ALIGNMENT)
            if align <= 0 or align & (align - 1):
                raise _Truncated(f"invalid alignment {align}")
            data_offset = (r.pos + align - 1) // align * align
    except _Truncated as exc:
        raise _invalid(path, str(exc)) from None
    except (ValueError, struct.error, OverflowError) as exc:
        raise _invalid(path, f"corrupt header ({exc})") from None
    meta = GGUFMeta(path, version, kv, tensors, data_offset, size)
    _check_extents(meta)
    return meta


def _check_extents(meta: GGUFMeta) -> None:
    """Every tensor's bytes must lie inside the file: a truncated download fails here."""
    end = meta.data_offset
    for t in meta.tensors:
        stop = meta.data_offset + t.offset + (t.n_bytes or 0)
        end = max(end, stop)
    if end > meta.file_size:
        raise _invalid(meta.path, f"tensor data ends at byte {end:,} but the file has {meta.file_size:,} "
                                  "bytes (truncated download?)")


def validate_gguf(path: Path | str, full: bool = True) -> None:
    """Raise IntegrityError unless ``path`` is a loadable-looking GGUF.

    ``full=False`` checks only size, magic and version (microseconds); the default also parses the
    header and checks that all tensor data is inside the file (well under a second).
    """
    if full:
        read_header(path)
    else:
        _check_preamble(Path(path))


# ---------------------------------------------------------------- summary


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
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None


def info_from_meta(meta: GGUFMeta) -> GGUFInfo:
    arch = str(meta.get("general.architecture", "unknown"))
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
