"""A LoRA adapter as the command line names it: `PATH[:SCALE]`.

The GGUF check itself (adapter type, architecture, shapes against the base) is
localspec.models.compat.check_lora; this module only turns the flag into a typed value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from localspec.errors import UsageError

DEFAULT_SCALE = 1.0


@dataclass(frozen=True)
class LoraSpec:
    """An adapter file and the scale its delta is applied with (llama.cpp's --lora-scaled)."""

    path: Path
    scale: float = DEFAULT_SCALE

    @property
    def label(self) -> str:
        """What a listing shows: the file name (never the full path, which may be private) and scale."""
        return self.path.name if self.scale == DEFAULT_SCALE else f"{self.path.name}:{self.scale:g}"


def _fail(text: str, why: str) -> UsageError:
    return UsageError(f"Invalid --lora {text!r}: {why}.", "Give --lora PATH or --lora PATH:SCALE, e.g. "
                                                          "--lora adapter.gguf:0.5.")


def parse_lora_spec(text: str) -> LoraSpec:
    """`PATH[:SCALE]`. A suffix after the last ':' is a scale only when it reads as a number and the
    whole text is not an existing file, so that a path with a colon in it still works."""
    if not text.strip():
        raise _fail(text, "no path")
    if "\0" in text:  # the OS cannot open such a path; say so here rather than fail deeper
        raise _fail(text, "the path has a NUL byte")
    head, sep, tail = text.rpartition(":")
    if not sep or Path(text).expanduser().is_file():
        return LoraSpec(Path(text).expanduser())
    try:
        scale = float(tail)
    except ValueError:
        return LoraSpec(Path(text).expanduser())  # a colon that is part of the path
    if not math.isfinite(scale):
        raise _fail(text, f"the scale {tail!r} is not a finite number")
    if not head.strip():
        raise _fail(text, "no path before the scale")
    return LoraSpec(Path(head).expanduser(), scale)

