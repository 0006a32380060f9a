"""The file being edited: read as text or refused, and replaced atomically with a backup kept."""

from __future__ import annotations

import os
import shutil
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
    newline = "\r\n" if "\r\n" in raw else "\n"
    return SourceFile(path=path, text=raw.replace("\r\n", "\n"), newline=newline)


def backup_path(path: Path) -> Path:
    """`<name>.bak`, or the first free `<name>.bak.N`: an earlier backup is never overwritten."""
    candidate = path.with_name(path.name + ".bak")
    n = 1
    while candidate.exists():
        candidate = path.with_name(f"{path.name}.bak.{n}")
        n += 1
    return candidate


def write_with_backup(source: SourceFile, text: str) -> Path:
    """Replace the file with `text` in one rename (a reader sees the old file or the new one, never
    half of one), keeping its mode; the old contents stay in the returned backup."""
    path = source.path
    backup = backup_path(path)
    shutil.copy2(path, backup)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".edit", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text.replace("\n", source.newline))
            f.flush()
            os.fsync(f.fileno())
        shutil.copymode(path, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return backup
