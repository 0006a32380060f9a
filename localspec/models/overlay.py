"""Writing the user's overlay registry (``<config>/models.toml``) for imported models."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

from localspec.errors import ConfigError
from localspec.models.gguf_summary import GGUFInfo
from localspec.models.registry import (
    MAX_FILE_NAME_BYTES,
    MAX_ID_LEN,
    FileSource,
    FileSpec,
    HFSource,
    ModelEntry,
    parse_registry_file,
)

HEADER = (
    "# localspec user registry: entries here add to or replace the built-in models.toml.\n"
    "# `localspec models import` and `localspec models pull hf.co/...` append to this file.\n"
)


# A stored file also gets ".partial" while written and a stamp in quarantine: the name stays well
# under the 255 bytes most file systems allow.
MAX_STORED_NAME_BYTES = MAX_FILE_NAME_BYTES


def id_from_filename(name: str) -> str:
    stem = name[:-5] if name.lower().endswith(".gguf") else name
    mid = re.sub(r"[^a-z0-9._+-]+", "-", stem.lower())[:MAX_ID_LEN].strip("-._")
    return mid or "imported-model"


def stored_name(name: str, model_id: str) -> str:
    """The file name an import is stored under: its own when plain and not too long, else one made
    from the id."""
    plain = name and not name.startswith(".") and "/" not in name and "\\" not in name and name.isprintable()
    return name if plain and len(name.encode()) <= MAX_STORED_NAME_BYTES else f"{model_id}.gguf"


def _q(v: str) -> str:
    # JSON string escaping is valid TOML basic-string escaping.
    return json.dumps(v, ensure_ascii=False)


def _metadata_lines(entry: ModelEntry) -> list[str]:
    """The entry's optional GGUF facts (quant, parameters, context), those it has."""
    lines = [f"quant = {_q(entry.quant)}"] if entry.quant else []
    if entry.parameters is not None:
        lines.append(f"parameters = {entry.parameters}")
    if entry.context_length is not None:
        lines.append(f"context_length = {entry.context_length}")
    return lines


def _block(entry: ModelEntry, spec: FileSpec) -> str:
    lines = ["", "[[models]]", f"id = {_q(entry.id)}", f"family = {_q(entry.family)}", f"role = {_q(entry.role)}"]
    lines += _metadata_lines(entry)
    lines += [
        "",
        "  [[models.sources]]",
        '  kind = "file"',
        f"  files = [{{ name = {_q(spec.name)}, size = {spec.size}, sha256 = {_q(spec.sha256 or '')} }}]",
        "",
    ]
    return "\n".join(lines)


def file_entry(model_id: str, role: str, origin: Path, info: GGUFInfo) -> ModelEntry:
    """The entry for a local file (written by add_entry once the file is in the store)."""
    from localspec.models.store import sha256_file

    spec = FileSpec(name=stored_name(origin.name, model_id), size=origin.stat().st_size, sha256=sha256_file(origin))
    return ModelEntry(
        id=model_id, family=info.architecture, role=role, quant=info.quant,
        parameters=info.parameters, context_length=info.context_length,
        sources=[FileSource(kind="file", files=[spec])],
    )


@contextlib.contextmanager
def _one_writer(overlay: Path) -> Iterator[None]:
    """One read-and-rewrite of the overlay at a time, across processes (advisory; POSIX only): two
    pulls or imports finishing together would each write back the file as read before the other's
    entry, and lose it (or find their temporary file taken)."""
    overlay.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # Windows: no cross-process lock
        yield
        return
    with open(overlay.with_name(overlay.name + ".lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def add_entry(overlay: Path, entry: ModelEntry) -> None:
    """Append a file_entry; the overlay is re-validated and restored on failure."""
    spec = entry.sources[0].files[0]
    with _one_writer(overlay):
        before = overlay.read_text(encoding="utf-8") if overlay.is_file() else HEADER
        _replace_checked(overlay, before + _block(entry, spec))


def _replace_checked(overlay: Path, text: str) -> None:
    """The overlay becomes `text` only if it parses as a registry: a bad entry never lands."""
    overlay.parent.mkdir(parents=True, exist_ok=True)
    tmp = overlay.with_name(overlay.name + ".partial")
    tmp.write_text(text, encoding="utf-8")
    try:
        parse_registry_file(tmp)
    except ConfigError:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, overlay)


# ---------------------------------------------------------------- models pulled from the Hub

_BEGIN = "# >>> pulled from the Hub: "
_END = "# <<< pulled from the Hub: "


def _file_line(f: FileSpec) -> str:
    parts = [f"name = {_q(f.name)}"]
    if f.repo_path:
        parts.append(f"repo_path = {_q(f.repo_path)}")
    if f.size is not None:
        parts.append(f"size = {f.size}")
    if f.sha256:
        parts.append(f"sha256 = {_q(f.sha256)}")
    return "    { " + ", ".join(parts) + " },"


def _hub_block(entry: ModelEntry, src: HFSource) -> str:
    lines = [f"{_BEGIN}{entry.id}", "[[models]]", f"id = {_q(entry.id)}",
             f"aliases = [{', '.join(_q(a) for a in entry.aliases)}]", f"family = {_q(entry.family)}",
             f"role = {_q(entry.role)}"]
    lines += _metadata_lines(entry)
    lines += ["", "  [[models.sources]]", '  kind = "hf"', f"  repo = {_q(src.repo)}",
              f"  revision = {_q(src.revision)}", "  files = ["]
    lines += [_file_line(f) for f in src.files]
    lines += ["  ]", f"{_END}{entry.id}"]
    return "\n".join(lines) + "\n"


def put_hub_entry(overlay: Path, entry: ModelEntry) -> None:
    """Write (or rewrite) the entry of a model pulled from the Hub, between marker lines so that a
    later pull of the same model replaces it; the overlay is re-validated and kept on failure."""
    src = entry.sources[0]
    assert isinstance(src, HFSource)
    block = _hub_block(entry, src)
    pattern = re.compile(rf"^{re.escape(_BEGIN + entry.id)}\n.*?^{re.escape(_END + entry.id)}\n", re.S | re.M)
    with _one_writer(overlay):
        before = overlay.read_text(encoding="utf-8") if overlay.is_file() else HEADER
        if pattern.search(before):
            text = pattern.sub(lambda _m: block, before, count=1)
        else:
            text = before + ("" if before.endswith("\n\n") else "\n" if before.endswith("\n") else "\n\n") + block
        _replace_checked(overlay, text)
