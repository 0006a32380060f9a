"""The file being edited: read as text or refused, and replaced atomically with a backup kept."""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from localspec.errors import UsageError

# Bigger files than this are refused before any tokenizing: far past every model's context.
MAX_FILE_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class SourceFile:
    path: Path
    text: str  # with "\n" line ends, as the model reads and writes them
    newline: str  # what the file on disk uses: "\n" or "\r\n", restored on write
    digest: str  # sha256 of the bytes read: a write first checks nobody changed them since


def read_source(path: Path) -> SourceFile:
    """The file as text; a clear refusal for what cannot be edited as text."""
    try:
        info = path.stat()
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist.", "Give the path of a text file to edit.") from None
    except OSError as exc:
        raise UsageError(f"Cannot read {path}: {exc.strerror}.", "Check the path and its permissions.") from None
    if not stat.S_ISREG(info.st_mode):
        raise UsageError(f"{path} is not a regular file.", "Give the path of a text file to edit.")
    if info.st_size > MAX_FILE_BYTES:
        raise UsageError(f"{path} is {info.st_size:,} bytes, more than the {MAX_FILE_BYTES:,} an edit reads.",
                         "Edit a smaller file, or split this one.")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"Cannot read {path}: {exc.strerror}.", "Check the path and its permissions.") from None
    nul = data.find(b"\0")
    if nul >= 0:
        raise UsageError(f"{path} looks binary (a NUL byte at offset {nul}).", "`localspec edit` edits text files.")
    try:
        raw = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path} is not UTF-8 text (byte {exc.start} cannot be decoded).",
                         "Convert it to UTF-8 first; `localspec edit` edits UTF-8 text files.") from None
    if raw.startswith("\ufeff"):
        raise UsageError(f"{path} starts with a byte-order mark.", "Remove the BOM (UTF-8 needs none) and retry.")
    # CRLF only when every line end is one: a file that mixes them is kept byte for byte.
    crlf = "\r\n" in raw and raw.count("\r\n") == raw.count("\n")
    return SourceFile(path=path, text=raw.replace("\r\n", "\n") if crlf else raw, newline="\r\n" if crlf else "\n",
                      digest=hashlib.sha256(data).hexdigest())


def _keep_backup(path: Path, data: bytes, mode: int) -> Path:
    """`<name>.bak`, or the first free `<name>.bak.N`, created exclusively and never through a
    symlink: an earlier backup is never overwritten, and a planted `.bak` link cannot make the
    backup land elsewhere."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    for n in range(10_000):
        candidate = path.with_name(path.name + (".bak" if n == 0 else f".bak.{n}"))
        try:
            fd = os.open(candidate, flags, 0o600)
        except FileExistsError:
            continue
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            os.fchmod(f.fileno(), stat.S_IMODE(mode))
        return candidate
    raise UsageError(f"{path} has 10,000 backups already.", "Remove old FILE.bak.N files and retry.")


def write_with_backup(source: SourceFile, text: str) -> Path:
    """Replace the file with `text` in one rename (a reader sees the old file or the new one, never
    half of one), keeping its mode; the old contents stay in the returned backup. A symlink's target
    is what gets edited (the link stays). Refused when the file changed since it was read: an
    editor's save in the meantime must not be lost."""
    path = Path(os.path.realpath(source.path))
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != source.digest:
        raise UsageError(f"{source.path} changed since the edit read it; nothing was written.",
                         "Run the edit again on the file as it is now.")
    mode = path.stat().st_mode
    backup = _keep_backup(path, data, mode)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".edit", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text.replace("\n", source.newline) if source.newline != "\n" else text)
            f.flush()
            os.fchmod(f.fileno(), stat.S_IMODE(mode))
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return backup
