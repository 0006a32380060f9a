"""GGUF metadata without loading weights, and the validity check that runs before llama.cpp.

gguf.GGUFReader builds a numpy view per array element, which takes ~10 s on a 150k-token vocab
(two such arrays: tokens and merges). This module walks the same header format with ``struct``
over an mmap instead, skipping string arrays by their length prefixes and decoding them only when
asked (``GGUFMeta.strings``), so `models info` stays well under a second. Types and size tables
come from the ``gguf`` package, so new quant types need no change here.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from localspec.errors import IntegrityError

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
MIN_SIZE = 24  # magic + version + tensor count + kv count
DEFAULT_ALIGNMENT = 32

# What a header may make us do: every count, length and size below is checked against these (and
# against the bytes left in the file) before anything is allocated. Real models stay far inside.
MAX_KEY_BYTES = 65_535  # the GGUF spec's limit on a key
MAX_STRING_BYTES = 16 << 20  # one metadata string; chat templates run to tens of KiB
MAX_ARRAY_ITEMS = 1 << 24  # one array; vocabularies and merge lists run to ~10^6
MAX_ENTRIES = 1 << 20  # keys, or tensors, in one file (real models: ~50 keys, ~1,000 tensors)
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_TENSOR_NAME = 63  # GGML_MAX_NAME is 64 bytes with the terminating NUL
INT64_MAX = (1 << 63) - 1
_MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, smallest value
_MIN_TENSOR_BYTES = 8 + 4 + 4 + 8  # name length, n_dims, type, offset

# llama.cpp reads these with an accessor that aborts the process on any other stored type.
_EXACT_TYPES = {"general.alignment": GGUFValueType.UINT32, "adapter.lora.alpha": GGUFValueType.FLOAT32}

_SCALAR = {
    GGUFValueType.UINT8: ("<B", np.uint8), GGUFValueType.INT8: ("<b", np.int8),
    GGUFValueType.UINT16: ("<H", np.uint16), GGUFValueType.INT16: ("<h", np.int16),
    GGUFValueType.UINT32: ("<I", np.uint32), GGUFValueType.INT32: ("<i", np.int32),
    GGUFValueType.FLOAT32: ("<f", np.float32), GGUFValueType.BOOL: ("<?", np.bool_),
    GGUFValueType.UINT64: ("<Q", np.uint64), GGUFValueType.INT64: ("<q", np.int64),
    GGUFValueType.FLOAT64: ("<d", np.float64),
}


class _Malformed(Exception):
    """The header is not a usable GGUF; the message is the reason, for one line."""


class _CutOff(_Malformed):
    """The bytes at hand end before the header does, though the file goes on: a prefix read over
    the network needs at least ``needed`` bytes. Over a whole file this is plain truncation."""

    def __init__(self, message: str, needed: int) -> None:
        super().__init__(message)
        self.needed = needed


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
    n_bytes: int


@dataclass
class GGUFMeta:
    """The parsed header: key/values, tensor table, and where tensor data starts."""

    path: Path
    version: int
    kv: dict[str, Any]
    tensors: list[TensorInfo]
    data_offset: int
    file_size: int
    prefix: bytes | None = field(default=None, repr=False)  # the header's bytes when read remotely

    def get(self, key: str, default: Any = None) -> Any:
        return self.kv.get(key, default)

    def strings(self, key: str) -> list[bytes]:
        """Decode a string array (e.g. ``tokenizer.ggml.tokens``) as raw bytes per item."""
        arr = self.kv.get(key)
        if not isinstance(arr, StringArray):
            return list(arr or [])
        if self.prefix is not None:  # read over the network: the items are in the bytes at hand
            try:
                return _items(self.prefix, arr)
            except (ValueError, struct.error):
                raise _invalid(self.path, f"{key} was not read (only the start of its header was)") from None
        out: list[bytes] = []
        unpack = struct.Struct("<Q").unpack_from
        try:
            with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                pos = arr.offset
                for _ in range(arr.count):
                    (n,) = unpack(mm, pos)
                    pos += 8
                    out.append(mm[pos:pos + n])
                    pos += n
        except (OSError, ValueError, struct.error) as exc:  # the file changed since its header was read
            raise _invalid(self.path, f"cannot read {key} ({exc})") from None
        return out


def _items(buf: bytes, arr: StringArray) -> list[bytes]:
    unpack = struct.Struct("<Q").unpack_from
    out, pos = [], arr.offset
    for _ in range(arr.count):
        (n,) = unpack(buf, pos)
        if pos + 8 + n > len(buf):
            raise ValueError("past the bytes read")
        out.append(bytes(buf[pos + 8:pos + 8 + n]))
        pos += 8 + n
    return out


class _Reader:
    """``buf`` holds the file's first ``size`` bytes of ``total`` (all of them for a local file)."""

    def __init__(self, buf: mmap.mmap | bytes, size: int, total: int | None = None) -> None:
        self.buf, self.size, self.pos = buf, size, 0
        self.total = size if total is None else total

    @property
    def left(self) -> int:
        """Bytes left in the file (claims are checked against these, not against a prefix)."""
        return self.total - self.pos

    def cut(self, end: int) -> _Malformed:
        if end > self.total or self.size >= self.total:
            return _Malformed(f"header is cut off at byte {self.total} (needed {end})")
        return _CutOff(f"header is cut off at byte {self.size} (needed {end})", end)

    def need(self, n: int) -> None:
        if n < 0:
            raise _Malformed(f"header is cut off at byte {self.size} (needed {self.pos + n})")
        if self.pos + n > self.size:
            raise self.cut(self.pos + n)

    def unpack(self, fmt: str, n: int) -> Any:
        self.need(n)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v

    def u32(self) -> int:
        return self.unpack("<I", 4)

    def u64(self) -> int:
        return self.unpack("<Q", 8)

    def raw_str(self, limit: int, what: str) -> bytes:
        n = self.u64()
        if n > limit:
            raise _Malformed(f"{what} claims {n:,} bytes (at most {limit:,})")
        self.need(n)
        s = self.buf[self.pos:self.pos + n]
        self.pos += n
        return s

    def vtype(self, code: int) -> GGUFValueType:
        try:
            return GGUFValueType(code)
        except ValueError:
            raise _Malformed(f"unknown metadata value type {code}") from None

    def value(self, t: GGUFValueType) -> Any:
        if t == GGUFValueType.STRING:
            return self.raw_str(MAX_STRING_BYTES, "a string").decode("utf-8", errors="replace")
        if t in _SCALAR:
            fmt, _ = _SCALAR[t]
            return self.unpack(fmt, struct.calcsize(fmt))
        return self.array()

    def array(self) -> StringArray | np.ndarray:
        itype = self.vtype(self.u32())
        count = self.u64()
        if itype == GGUFValueType.ARRAY:  # llama.cpp refuses them too; refusing also bounds the recursion
            raise _Malformed("an array of arrays (not allowed in GGUF models)")
        if count > MAX_ARRAY_ITEMS:
            raise _Malformed(f"an array claims {count:,} items (at most {MAX_ARRAY_ITEMS:,})")
        if itype == GGUFValueType.STRING:
            return self.string_array(count)
        fmt, dtype = _SCALAR[itype]
        nbytes = struct.calcsize(fmt) * count
        self.need(nbytes)
        arr = np.frombuffer(self.buf, dtype=np.dtype(dtype).newbyteorder("<"), count=count, offset=self.pos).copy()
        self.pos += nbytes
        return arr

    def string_array(self, count: int) -> StringArray:
        if count * 8 > self.left:
            raise _Malformed(f"a string array claims {count:,} items but {self.left:,} bytes are left")
        start = pos = self.pos
        unpack = struct.Struct("<Q").unpack_from
        size, buf = self.size, self.buf
        for _ in range(count):  # skip items by their length prefixes
            if pos + 8 > size:
                raise self.cut(pos + 8)
            (n,) = unpack(buf, pos)
            pos += 8 + n
            if pos > size:
                raise self.cut(pos)
        self.pos = pos
        return StringArray(start, count)


def _invalid(path: Path | str, reason: str) -> IntegrityError:
    return IntegrityError(
        f"{path} is not a valid GGUF file: {reason}.",
        "Delete it and pull the model again (`localspec models pull ID`), or re-export the GGUF.",
    )


NAMED_FILE_FIX = "Check the path; it must be a GGUF file."


def named_file_error(exc: IntegrityError, fix: str = NAMED_FILE_FIX) -> IntegrityError:
    """`exc` for a file the user named (an import, `models info PATH`, a LoRA adapter): _invalid's fix,
    pulling the model again, is for a file of the store."""
    return IntegrityError(exc.cause, fix)


def _check_preamble(path: Path) -> int:
    """Existence, size, magic and version: cheap checks before any parsing."""
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise _invalid(path, "not a regular file")
        if size <= MIN_SIZE:
            raise _invalid(path, f"only {size} bytes (empty or truncated)")
        with open(path, "rb") as f:
            head = f.read(8)
    except FileNotFoundError:
        raise _invalid(path, "no such file") from None
    except OSError as exc:
        raise _invalid(path, f"cannot read it ({exc.strerror or exc})") from None
    if head[:4] != MAGIC:
        raise _invalid(path, f"bad magic {head[:4]!r} (expected b'GGUF')")
    (version,) = struct.unpack("<I", head[4:8])
    if version not in SUPPORTED_VERSIONS:
        swapped = struct.unpack(">I", head[4:8])[0]
        if swapped in SUPPORTED_VERSIONS:
            raise _invalid(path, "big-endian GGUF, which this build cannot load")
        raise _invalid(path, f"unsupported GGUF version {version} (supported: 2, 3)")
    return size


def _count(r: _Reader, what: str, min_bytes: int) -> int:
    n = r.u64()
    if n > MAX_ENTRIES or n * min_bytes > r.left:
        raise _Malformed(f"the header claims {n:,} {what}, more than its {r.left:,} remaining bytes can hold")
    return n


def _read_kv(r: _Reader, n_kv: int) -> dict[str, Any]:
    kv: dict[str, Any] = {}
    for _ in range(n_kv):
        key = r.raw_str(MAX_KEY_BYTES, "a key").decode("utf-8", errors="replace")
        if key in kv:
            raise _Malformed(f"key {key!r} appears twice")
        try:
            t = r.vtype(r.u32())
            exact = _EXACT_TYPES.get(key)
            if exact is not None and t != exact:
                raise _Malformed(f"it is {t.name}, not {exact.name}")
            kv[key] = r.value(t)
        except _CutOff:
            raise  # more bytes will do: a remote reader asks for them
        except _Malformed as exc:
            raise _Malformed(f"key {key!r}: {exc}") from None
    return kv


def _tensor_bytes(name: str, dims: tuple[int, ...], gtype: int) -> tuple[int, int]:
    """(elements, bytes) of one tensor, refusing what ggml would refuse or overflow on."""
    for d in dims:
        if d == 0 or d > INT64_MAX:  # ggml divides by dimensions and reads them as int64
            raise _Malformed(f"tensor {name!r} has a dimension of {d:,}")
    n_el = math.prod(dims)  # exact: no wrap-around to 0
    if n_el >= INT64_MAX:
        raise _Malformed(f"tensor {name!r} of shape {dims} has {n_el:,} elements, which overflows 64 bits")
    try:
        block, tsize = GGML_QUANT_SIZES[GGMLQuantizationType(gtype)]
    except (ValueError, KeyError):
        raise _Malformed(f"tensor {name!r} has unknown ggml type {gtype}") from None
    if dims and dims[0] % block:
        raise _Malformed(f"tensor {name!r} rows of {dims[0]} are not a multiple of its block size {block}")
    return n_el, n_el // block * tsize


def _read_tensors(r: _Reader, n_tensors: int) -> list[TensorInfo]:
    tensors: list[TensorInfo] = []
    names: set[str] = set()
    for _ in range(n_tensors):
        name = r.raw_str(MAX_TENSOR_NAME, "a tensor name").decode("utf-8", errors="replace")
        if name in names:
            raise _Malformed(f"tensor {name!r} appears twice")
        names.add(name)
        n_dims = r.u32()
        if n_dims > MAX_DIMS:
            raise _Malformed(f"tensor {name!r} claims {n_dims} dimensions (at most {MAX_DIMS})")
        dims = tuple(r.u64() for _ in range(n_dims))
        gtype = r.u32()
        offset = r.u64()
        n_el, n_bytes = _tensor_bytes(name, dims, gtype)
        tensors.append(TensorInfo(name, dims, gtype, offset, n_el, n_bytes))
    return tensors


def _alignment(kv: dict[str, Any]) -> int:
    align = kv.get("general.alignment", DEFAULT_ALIGNMENT)
    if align <= 0 or align & (align - 1):
        raise _Malformed(f"invalid alignment {align}")
    return int(align)


def read_header(path: Path | str) -> GGUFMeta:
    """Parse and validate the header and tensor table; raises IntegrityError when invalid.

    Every failure, whatever the file holds, is that one-line IntegrityError: the limits above bound
    what the header can make us allocate, and any other surprise is reported as a corrupt header.
    """
    path = Path(path)
    size = _check_preamble(path)
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            r = _Reader(mm, size)
            r.pos = 4
            version = r.u32()
            n_tensors = _count(r, "tensors", _MIN_TENSOR_BYTES)
            kv = _read_kv(r, _count(r, "keys", _MIN_KV_BYTES))
            if n_tensors * _MIN_TENSOR_BYTES > r.left:
                raise _Malformed(f"the header claims {n_tensors:,} tensors but {r.left:,} bytes are left")
            tensors = _read_tensors(r, n_tensors)
            check_known_keys(kv)
            align = _alignment(kv)
            data_offset = (r.pos + align - 1) // align * align
    except _Malformed as exc:
        raise _invalid(path, str(exc)) from None
    except OSError as exc:
        raise _invalid(path, f"cannot read it ({exc.strerror or exc})") from None
    except Exception as exc:  # noqa: BLE001  untrusted bytes: any other surprise is still one line
        raise _invalid(path, f"corrupt header ({type(exc).__name__}: {exc})") from None
    meta = GGUFMeta(path, version, kv, tensors, data_offset, size)
    _check_is_model(meta)
    _check_extents(meta, align)
    return meta


class HeaderIncomplete(Exception):
    """The bytes given end inside the header; ``needed`` is the least that would get further."""

    def __init__(self, needed: int) -> None:
        super().__init__(f"needs at least {needed:,} bytes")
        self.needed = needed


def _read_kv_until_vocab(r: _Reader, n_kv: int) -> dict[str, Any]:
    """Like _read_kv, but the token list's length is all that is read of it, and the keys after it
    are not read: what a fit estimate needs, from a few KiB instead of megabytes."""
    kv: dict[str, Any] = {}
    for _ in range(n_kv):
        key = r.raw_str(MAX_KEY_BYTES, "a key").decode("utf-8", errors="replace")
        if key in kv:
            raise _Malformed(f"key {key!r} appears twice")
        t = r.vtype(r.u32())
        if key == "tokenizer.ggml.tokens" and t == GGUFValueType.ARRAY:
            itype, count = r.vtype(r.u32()), r.u64()
            if itype != GGUFValueType.STRING or count > MAX_ARRAY_ITEMS or count * 8 > r.left:
                raise _Malformed(f"key {key!r} must be a list of at most {MAX_ARRAY_ITEMS:,} strings")
            kv[key] = StringArray(r.pos, int(count))  # its items are not at hand: never decoded
            break
        try:
            kv[key] = r.value(t)
        except _CutOff:
            raise
        except _Malformed as exc:
            raise _Malformed(f"key {key!r}: {exc}") from None
    return kv


def parse_header_prefix(buf: bytes, total: int, source: str, *, vocab_count_only: bool = False) -> GGUFMeta:
    """The key/values of a GGUF of ``total`` bytes from its first ``len(buf)`` bytes (a remote
    file's ranged read); the tensor table is not read. Raises HeaderIncomplete when more bytes are
    needed, IntegrityError (one line naming ``source``) when the bytes are not a GGUF header.

    ``vocab_count_only`` stops at the token list, keeping only its length (no strings, and none of
    the keys after it: BOS/EOS and the chat template are then unknown)."""
    if len(buf) < MIN_SIZE:
        if total <= MIN_SIZE:
            raise _invalid(source, f"only {total} bytes (empty or truncated)")
        raise HeaderIncomplete(MIN_SIZE + 1)
    if buf[:4] != MAGIC:
        raise _invalid(source, f"bad magic {buf[:4]!r} (expected b'GGUF')")
    r = _Reader(buf, len(buf), max(total, len(buf)))
    r.pos = 4
    try:
        version = r.u32()
        if version not in SUPPORTED_VERSIONS:
            raise _Malformed(f"unsupported GGUF version {version} (supported: 2, 3)")
        _count(r, "tensors", _MIN_TENSOR_BYTES)
        n_kv = _count(r, "keys", _MIN_KV_BYTES)
        kv = _read_kv_until_vocab(r, n_kv) if vocab_count_only else _read_kv(r, n_kv)
        check_known_keys(kv)
        _alignment(kv)
    except _CutOff as exc:
        raise HeaderIncomplete(exc.needed) from None
    except _Malformed as exc:
        raise _invalid(source, str(exc)) from None
    except Exception as exc:  # noqa: BLE001  untrusted bytes: any other surprise is still one line
        raise _invalid(source, f"corrupt header ({type(exc).__name__}: {exc})") from None
    if not kv.get("general.architecture") and kv.get("split.no", 0) == 0:
        raise _invalid(source, "it has no general.architecture, so it is not a model")
    # data_offset: where the key/values end (the tensor table, not read, starts there).
    return GGUFMeta(Path(source.rsplit("/", 1)[-1]), version, kv, [], r.pos, total, prefix=bytes(buf[:r.pos]))


def _check_extents(meta: GGUFMeta, align: int) -> None:
    """Tensors lie back to back, in order, each padded to the alignment (as llama.cpp requires), and
    all inside the file: a truncated download fails here."""
    expected = 0
    for t in meta.tensors:
        if t.offset != expected:
            raise _invalid(meta.path, f"tensor {t.name!r} starts at data offset {t.offset:,}, expected {expected:,}")
        expected += (t.n_bytes + align - 1) // align * align
    if not meta.tensors:
        return  # no data section at all
    end = meta.data_offset + max(t.offset + t.n_bytes for t in meta.tensors)
    if end > meta.file_size:
        raise _invalid(meta.path, f"tensor data ends at byte {end:,} but the file has {meta.file_size:,} "
                                  "bytes (truncated download?)")


def _check_is_model(meta: GGUFMeta) -> None:
    """A file with no architecture or no tensors is not a model (the later shards of a split model
    carry only split.* keys, and a split's first shard may hold no tensors)."""
    split_count, split_no = meta.get("split.count", 1), meta.get("split.no", 0)
    if not meta.get("general.architecture") and split_no == 0:
        raise _invalid(meta.path, "it has no general.architecture, so it is not a model")
    if not meta.tensors and split_count <= 1:
        raise _invalid(meta.path, "it has no tensors, so it is not a model")


def validate_gguf(path: Path | str, full: bool = True) -> None:
    """Raise IntegrityError unless ``path`` is a loadable-looking GGUF.

    ``full=False`` checks only size, magic and version (microseconds); the default also parses the
    header and checks that all tensor data is inside the file (well under a second).
    """
    if full:
        read_header(path)
    else:
        _check_preamble(Path(path))


# ---------------------------------------------------------------- known keys


class _Kind(Enum):
    """What a known key must hold; a wrong type would crash a reader that trusts it."""

    TEXT = "a string"
    COUNT = "a non-negative integer"
    POSITIVE = "a positive integer"
    NUMBER = "a number"
    COUNT_OR_COUNTS = "a non-negative integer or an array of them"
    TEXTS = "an array of strings"
    INTS = "an array of integers"
    NUMBERS = "an array of numbers"


_GENERAL_KEYS = {
    "general.architecture": _Kind.TEXT, "general.name": _Kind.TEXT, "general.type": _Kind.TEXT,
    "general.file_type": _Kind.COUNT, "general.quantization_version": _Kind.COUNT,
    "adapter.type": _Kind.TEXT, "adapter.lora.alpha": _Kind.NUMBER,
    "tokenizer.ggml.model": _Kind.TEXT, "tokenizer.ggml.pre": _Kind.TEXT, "tokenizer.chat_template": _Kind.TEXT,
    "tokenizer.ggml.tokens": _Kind.TEXTS, "tokenizer.ggml.merges": _Kind.TEXTS,
    "tokenizer.ggml.token_type": _Kind.INTS, "tokenizer.ggml.scores": _Kind.NUMBERS,
    "tokenizer.ggml.bos_token_id": _Kind.COUNT, "tokenizer.ggml.eos_token_id": _Kind.COUNT,
    "tokenizer.ggml.unknown_token_id": _Kind.COUNT, "tokenizer.ggml.padding_token_id": _Kind.COUNT,
    "split.no": _Kind.COUNT, "split.count": _Kind.COUNT, "split.tensors.count": _Kind.COUNT,
}
_ARCH_KEYS = {  # prefixed with the architecture's name
    "context_length": _Kind.POSITIVE, "block_count": _Kind.COUNT, "embedding_length": _Kind.COUNT,
    "feed_forward_length": _Kind.COUNT_OR_COUNTS, "attention.head_count": _Kind.COUNT_OR_COUNTS,
    "attention.head_count_kv": _Kind.COUNT_OR_COUNTS, "attention.key_length": _Kind.COUNT,
    "attention.value_length": _Kind.COUNT,
}


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _fits(kind: _Kind, v: Any) -> bool:
    ints = isinstance(v, np.ndarray) and v.dtype.kind in "iu"
    return {
        _Kind.TEXT: lambda: isinstance(v, str),
        _Kind.COUNT: lambda: is_int(v) and v >= 0,
        _Kind.POSITIVE: lambda: is_int(v) and v > 0,
        _Kind.NUMBER: lambda: (is_int(v) or isinstance(v, float)),
        _Kind.COUNT_OR_COUNTS: lambda: (is_int(v) and v >= 0) or (ints and bool((v >= 0).all())),
        _Kind.TEXTS: lambda: isinstance(v, StringArray),
        _Kind.INTS: lambda: ints,
        _Kind.NUMBERS: lambda: isinstance(v, np.ndarray) and v.dtype.kind in "iuf",
    }[kind]()


def _shown(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return f"an array of {v.size} {v.dtype}"
    if isinstance(v, StringArray):
        return f"an array of {v.count} strings"
    return f"{type(v).__name__} {str(v)[:40]!r}"


def check_known_keys(kv: dict[str, Any]) -> None:
    """Keys this package (and llama.cpp) read must hold the type they are read as."""
    arch = kv.get("general.architecture")
    wanted = dict(_GENERAL_KEYS)
    if isinstance(arch, str):
        wanted.update({f"{arch}.{k}": kind for k, kind in _ARCH_KEYS.items()})
    for key, kind in wanted.items():
        if key in kv and not _fits(kind, kv[key]):
            raise _Malformed(f"key {key!r} must be {kind.value}, not {_shown(kv[key])}")
    tokens = kv.get("tokenizer.ggml.tokens")
    for key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
        if tokens is not None and key in kv and len(kv[key]) != len(tokens):
            raise _Malformed(f"key {key!r} has {len(kv[key]):,} items for {len(tokens):,} tokens")
