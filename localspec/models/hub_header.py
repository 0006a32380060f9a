"""A Hub GGUF's header, read with HTTP range requests before anything downloads.

`models search` and `models pull hf.co/...` judge fit from the header (weights plus the KV cache
for the context) and check a draft's tokenizer against the target's, without the weights. The
header is read from the file's resolve URL with ``Range: bytes=A-B`` requests through
huggingface-hub's session and auth headers, growing the range until the key/values parse: a few
KiB up to the token list for fit, the whole key/value section (the token texts: ~6 MB for a
150k-token vocabulary) for tokenizer compatibility. The tensor table is never read: fit takes the
weights' size from the listing.

A server that answers a range request with the whole file (200) is hung up on before its body is
read, and the model is judged from its file size alone, saying so; so is one whose header runs
past MAX_HEADER_BYTES (or MAX_REQUESTS), one that answers a shorter range than asked before the
file's end, or one that cannot be reached. Bytes that are not a GGUF header are one line.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from enum import Enum

from localspec.errors import IntegrityError
from localspec.models.fit import FitEstimate, estimate_fit, fit_verdict_for_size
from localspec.models.gguf_info import GGUFMeta, HeaderIncomplete, parse_header_prefix
from localspec.models.gguf_summary import GGUFInfo, info_from_meta
from localspec.models.units import human_bytes

FIRST_READ_BYTES = 64 << 10  # the keys before the token list, in most models, with room to spare
MAX_HEADER_BYTES = 32 << 20  # a 256k-token vocabulary with scores and merges stays well inside
TIMEOUT_S = 10.0  # one range request
MAX_REQUESTS = 16  # doubling from 64 KiB reaches MAX_HEADER_BYTES in 10
_CONTENT_RANGE_RE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


class Depth(Enum):
    FIT = "fit"  # up to the token list's length: what a fit estimate needs (a few KiB)
    TOKENS = "tokens"  # every key/value, token texts included: what a tokenizer comparison needs


class Outcome(Enum):
    READ = "read"
    NO_RANGE = "the server ignores HTTP range requests"
    TOO_LONG = "the header is too long to read ahead"
    UNREACHABLE = "the header could not be fetched"
    INVALID = "not a GGUF header"


@dataclass(frozen=True)
class HeaderRead:
    """What a ranged read of one remote GGUF gave: its parsed header, or why there is none."""

    outcome: Outcome
    meta: GGUFMeta | None
    detail: str  # why there is no header, for one line ("" when read)
    bytes_read: int
    requests: int
    error: IntegrityError | None = None  # INVALID: the one-line reason, to refuse a pull with

    @property
    def info(self) -> GGUFInfo | None:
        return info_from_meta(self.meta) if self.meta is not None else None


class _NoRange(Exception):
    pass


class _Failed(Exception):
    pass


def _fetch_range(url: str, start: int, end: int) -> bytes:
    """Bytes ``start``..``end`` (inclusive) of ``url``: a 206 of that range or _NoRange, never a
    whole file."""
    from huggingface_hub.utils import build_hf_headers, get_session

    headers = {**build_hf_headers(), "Range": f"bytes={start}-{end}", "Accept-Encoding": "identity"}
    want = end - start + 1
    with get_session().stream("GET", url, headers=headers, timeout=TIMEOUT_S, follow_redirects=True) as resp:
        if resp.status_code == 200:
            raise _NoRange()  # hung up before its body: this would be the whole file
        if resp.status_code != 206:
            code = resp.headers.get("X-Error-Code")
            raise _Failed(f"HTTP {resp.status_code}" + (f" ({code})" if code else ""))
        m = _CONTENT_RANGE_RE.fullmatch(resp.headers.get("Content-Range", "").strip())
        if m is None or int(m.group(1)) != start:
            raise _Failed(f"the server sent another range ({resp.headers.get('Content-Range')!r})")
        out = bytearray()
        for chunk in resp.iter_bytes():
            out += chunk
            if len(out) >= want:
                break  # a server that sends more than asked is not read further
    if not out:
        raise _Failed("an empty range")
    at_eof = m.group(3) != "*" and start + len(out) == int(m.group(3))
    if len(out) < want and not at_eof:  # a server dribbling short ranges is not followed byte by byte
        raise _Failed(f"a short range ({len(out)} of {want} bytes)")
    return bytes(out[:want])


def read_remote_header(repo: str, path: str, revision: str, size: int, *, depth: Depth = Depth.FIT,
                       max_bytes: int = MAX_HEADER_BYTES) -> HeaderRead:
    """The header of ``repo``'s file ``path`` (``size`` bytes, from the listing), by range requests."""
    from huggingface_hub import hf_hub_url

    from localspec.models.hub import endpoint

    if size <= 0:  # nothing to ask for (a range 0--1 is no range): the listing's size decides alone
        return HeaderRead(Outcome.UNREACHABLE, None, f"{Outcome.UNREACHABLE.value}: the listing gives no size", 0, 0)
    url = hf_hub_url(repo, path, revision=revision, endpoint=endpoint())
    source = f"{repo}/{path}"
    buf = b""
    want = min(FIRST_READ_BYTES, size)
    requests = 0
    while True:
        if requests >= MAX_REQUESTS:  # each read at least doubles the range: only a broken server gets here
            return HeaderRead(Outcome.TOO_LONG, None, f"{Outcome.TOO_LONG.value} (over {MAX_REQUESTS} requests)",
                              len(buf), requests)
        try:
            requests += 1
            buf += _fetch_range(url, len(buf), want - 1)
        except _NoRange:
            return HeaderRead(Outcome.NO_RANGE, None, f"{Outcome.NO_RANGE.value} (it answered 200)", len(buf),
                              requests)
        except _Failed as exc:
            return HeaderRead(Outcome.UNREACHABLE, None, f"{Outcome.UNREACHABLE.value}: {exc}", len(buf), requests)
        except Exception as exc:  # noqa: BLE001  network: DNS, refused, timeout, TLS
            first = (str(exc).strip().splitlines() or [""])[0][:120]
            return HeaderRead(Outcome.UNREACHABLE, None, f"{Outcome.UNREACHABLE.value}: {type(exc).__name__} {first}",
                              len(buf), requests)
        try:
            meta = parse_header_prefix(buf, size, source, vocab_count_only=depth is Depth.FIT)
        except HeaderIncomplete as more:
            if len(buf) >= size:  # cannot happen: a whole file is never incomplete; bounded anyway
                return HeaderRead(Outcome.INVALID, None, "the file ends inside its header", len(buf), requests)
            want = min(size, max(more.needed, 2 * len(buf)))  # doubling: a 6 MB header in ~7 requests
            if want > max_bytes:
                return HeaderRead(Outcome.TOO_LONG, None,
                                  f"{Outcome.TOO_LONG.value} (over {human_bytes(max_bytes)})", len(buf), requests)
            continue
        except IntegrityError as exc:
            return HeaderRead(Outcome.INVALID, None, exc.cause, len(buf), requests, exc)
        return HeaderRead(Outcome.READ, meta, "", len(buf), requests)


# ---------------------------------------------------------------- fit


@dataclass(frozen=True)
class RemoteFit:
    """A quant's fit verdict before download: from its header when read, else its size alone."""

    verdict: str  # "fits in VRAM" | "fits in RAM" | "too large"
    estimate: FitEstimate | None  # None: judged from the file size (no KV cache counted)
    why_size_only: str  # "" when the header was used

    @property
    def line(self) -> str:
        e = self.estimate
        if e is None:
            return f"{self.verdict} (from the file size only: {self.why_size_only})"
        return (f"{self.verdict}: {human_bytes(e.weights_bytes)} weights + {human_bytes(e.kv_bytes)} KV cache "
                f"at n_ctx {e.n_ctx:,} + {human_bytes(e.compute_bytes)} buffers")


def context_for(info: GGUFInfo, n_ctx: int) -> int:
    """The context a load would use: the profile's, but never past what the model was trained on."""
    return min(n_ctx, info.context_length) if info.context_length else n_ctx


def remote_fit(weights: int, header: HeaderRead | None, n_ctx: int, *, ram: int | None = None,
               vram: int | None = None) -> RemoteFit:
    """``weights``: the quant's bytes (all its shards). The header's KV layout is the model's, the
    same in every quant of a repo, so one header serves them all."""
    info = header.info if header is not None else None
    if info is None or not info.kv_bytes_per_token():
        why = ("its header was not read" if header is None
               else header.detail or "its header gives no KV cache layout")
        return RemoteFit(fit_verdict_for_size(weights, ram, vram), None, why)
    info = dataclasses.replace(info, file_size=weights)
    est = estimate_fit(info, n_ctx=context_for(info, n_ctx), ram=ram, vram=vram)
    return RemoteFit(est.verdict, est, "")
