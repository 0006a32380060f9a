"""A model's own settings (its registry entry's [models.settings]) turned into what the engine takes.

The chat template file is untrusted input: it must be a regular file, at most the sandbox's
template size, valid UTF-8; rendering it then goes through the same sandbox and load-time probe
as a GGUF's own template (engine.chat).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from localspec.engine.config import RequestDefaults
from localspec.engine.sampling import SamplingParams
from localspec.engine.template_sandbox import MAX_TEMPLATE_CHARS
from localspec.errors import ConfigError
from localspec.models.registry import ModelSettings

MAX_TEMPLATE_BYTES = 4 * MAX_TEMPLATE_CHARS  # UTF-8 takes at most 4 bytes a character


@dataclass(frozen=True)
class TargetSettings:
    """What a model's settings give the engine: n_ctx for its config, a template, request defaults."""

    n_ctx: int | None = None
    chat_template: str | None = None  # the template's text, read and checked
    defaults: RequestDefaults = RequestDefaults()


def target_settings(model_id: str, settings: ModelSettings | None) -> TargetSettings:
    if settings is None:
        return TargetSettings()
    template = read_chat_template(settings.chat_template, model_id=model_id) if settings.chat_template else None
    sampling = SamplingParams(**settings.sampling_values())  # validated by the registry already
    return TargetSettings(n_ctx=settings.n_ctx, chat_template=template,
                          defaults=RequestDefaults(sampling=sampling, stop=list(settings.stop or []),
                                                   template_vars=dict(settings.template_vars or {})))


def _template_error(model_id: str, path: str, reason: str) -> ConfigError:
    return ConfigError(
        f"Model {model_id!r}: settings.chat_template {path}: {reason}.",
        f"Point settings.chat_template of {model_id!r} in the registry overlay at a UTF-8 Jinja file of at most "
        f"{MAX_TEMPLATE_CHARS // 1024} KiB, or remove the key to use the model's own template.",
    )


def read_chat_template(path: str, *, model_id: str) -> str:
    """The template file's text; a one-line ConfigError naming the model and the key when unusable."""
    try:
        # O_NONBLOCK: a FIFO named here must not hang the load; it is refused below as not a file.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise _template_error(model_id, path, f"cannot open it ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _template_error(model_id, path, "not a regular file")
        if st.st_size > MAX_TEMPLATE_BYTES:
            raise _template_error(model_id, path, f"{st.st_size:,} bytes (at most {MAX_TEMPLATE_BYTES:,})")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(MAX_TEMPLATE_BYTES + 1)  # the file may grow after fstat
    except OSError as exc:
        raise _template_error(model_id, path, f"cannot read it ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if len(data) > MAX_TEMPLATE_BYTES:
        raise _template_error(model_id, path, f"more than {MAX_TEMPLATE_BYTES:,} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _template_error(model_id, path, f"not UTF-8 (byte {exc.start})") from None
    if not text.strip():
        raise _template_error(model_id, path, "empty")
    if len(text) > MAX_TEMPLATE_CHARS:
        raise _template_error(model_id, path, f"{len(text):,} characters (at most {MAX_TEMPLATE_CHARS:,})")
    return text
