"""Render chat messages with the GGUF's own template: sandboxed, budgeted, and probed at load.

A GGUF's chat template is code from whoever made the file. Three layers keep it in its place:
- Jinja's immutable sandbox (jinja2 >= 3.1.6: older ones let `|attr('format')` reach Python
  internals, CVE-2025-27516), made strict: touching an internal attribute is an error, not '';
- budgets on every render (template_sandbox.py): steps, sizes, output and data;
- a probe when a model loads: the template renders a sample chat in a child process under a
  wall-clock, CPU and memory limit. A template refused there makes the model chat-less (raw
  prompts still work); the verdict is cached per template text.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import jinja2
from jinja2 import TemplateError, TemplateSyntaxError
from jinja2.exceptions import SecurityError
from pydantic import BaseModel, ConfigDict

from localspec.engine import template_sandbox
from localspec.engine.template_sandbox import RenderLimitError
from localspec.errors import LocalspecError, RequestError

logger = logging.getLogger(__name__)

# Used when a GGUF carries no template: ChatML, which Qwen and many others speak.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

JINJA_MIN = (3, 1, 6)
# The child's own limits (template_sandbox.PROBE_SECONDS, RLIMIT_CPU) end it first; this is the
# backstop for a child that cannot even start its clock.
PROBE_TIMEOUT_S = 30.0


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""


def check_jinja(version: str | None = None) -> None:
    """Refuse a jinja2 whose sandbox a chat template can escape."""
    version = version or jinja2.__version__
    parts = tuple(int(n) for n in re.findall(r"\d+", version)[:3])
    if parts < JINJA_MIN:
        raise LocalspecError(
            f"jinja2 {version} is installed; before 3.1.6 a model's chat template could escape the sandbox "
            "(CVE-2025-27516).",
            "Upgrade it: pip install 'jinja2>=3.1.6'.",
        )


def render_chat(
    template: str | None,
    messages: list[ChatMessage],
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    tools: list[dict] | None = None,
    extra: Mapping[str, object] | None = None,
) -> str:
    """`extra`: the request's own variables (GenerationRequest.template_vars, checked there); the
    rendering's own win over them."""
    check_jinja()
    variables: dict[str, object] = dict(extra or {})
    variables.update(
        messages=[m.model_dump(exclude_none=True) for m in messages],
        add_generation_prompt=add_generation_prompt,
        bos_token=bos_token,
        eos_token=eos_token,
    )
    if tools:
        variables["tools"] = tools
    try:
        return template_sandbox.render(template or CHATML, variables)
    except RenderLimitError as exc:
        raise RequestError(
            f"The chat template ran past a safety limit and was stopped: {exc}.",
            "Send smaller or flatter messages and tools; if a small request does this, the model's template is "
            "at fault: use a GGUF with a trustworthy chat template, or pass a raw prompt instead of messages.",
        ) from exc
    except SecurityError as exc:
        raise RequestError(
            f"The model's chat template tried something unsafe and was refused: {exc}.",
            "Use a GGUF with a trustworthy chat template, or pass a raw prompt instead of messages.",
        ) from exc
    except TemplateSyntaxError as exc:  # whatever the messages: the template itself is broken
        raise RequestError(
            f"The chat template is not valid Jinja (line {exc.lineno}: {str(exc.message or exc).rstrip('.')}).",
            "Fix the template (a model's settings.chat_template in models.toml) or use another GGUF; a raw "
            "prompt needs none (`localspec generate` without --chat, /v1/completions).",
        ) from exc
    except TemplateError as exc:
        raise RequestError(f"The chat template failed: {str(exc).rstrip('.')}.",
                           "Check the messages' roles and order.") from exc
    except Exception as exc:  # noqa: BLE001 - the template's own bug (`1 + 'a'`): a request error, not a crash
        raise RequestError(
            f"The chat template failed: {type(exc).__name__}: {exc}.",
            "Check the messages, or pass a raw prompt instead of messages.",
        ) from exc


# ---------------------------------------------------------------------- the load-time probe


@dataclass(frozen=True)
class TemplateVerdict:
    ok: bool
    reason: str = ""  # why a template was refused


_ACCEPTED = TemplateVerdict(True)
_verdicts: dict[str, TemplateVerdict] = {}
_verdicts_lock = threading.Lock()


def probe_template(template: str | None, bos: str = "", eos: str = "") -> TemplateVerdict:
    """Render a sample chat with `template` in a child process under time and memory limits.

    Cached per (template, bos, eos): a process probes each template once. No template means the
    built-in ChatML, which needs no probe.
    """
    if template is None:
        return _ACCEPTED
    key = hashlib.sha256(json.dumps([template, bos, eos]).encode("utf-8", "surrogatepass")).hexdigest()
    with _verdicts_lock:
        cached = _verdicts.get(key)
    if cached is not None:
        return cached
    verdict = _run_probe(template, bos, eos)
    with _verdicts_lock:
        _verdicts[key] = verdict
    return verdict


def probe_command() -> list[str]:
    """The probe child's command line. A frozen (standalone) app runs itself with the internal flag
    its entry point knows (packaging/standalone_entry.py); it has no separate interpreter."""
    if getattr(sys, "frozen", False):
        return [sys.executable, "--template-probe"]
    # -I: an isolated interpreter (no PYTHONPATH, no user site, no script directory on the path).
    # It is told where this process found jinja2 and markupsafe: they may be on the PYTHONPATH that
    # -I drops (deps installed with `pip --target`), and a probe that cannot import them refused
    # every template.
    return [sys.executable, "-I", "-c", _PROBE_BOOT, str(Path(template_sandbox.__file__)), *_dependency_dirs()]


# argv: -c, the sandbox's path, then directories to search after the interpreter's own (appended, so
# nothing there shadows the standard library).
_PROBE_BOOT = ("import runpy, sys; path = sys.argv[1]; sys.path += [d for d in sys.argv[2:] if d not in sys.path]; "
               "sys.argv = [path, '--probe']; runpy.run_path(path, run_name='__main__')")


def _dependency_dirs() -> list[str]:
    import jinja2
    import markupsafe

    return list(dict.fromkeys(str(Path(m.__file__).resolve().parent.parent) for m in (jinja2, markupsafe)
                              if m.__file__))


def _run_probe(template: str, bos: str, eos: str) -> TemplateVerdict:
    cmd = probe_command()
    request = json.dumps({"template": template, "bos": bos, "eos": eos})
    try:
        proc = subprocess.run(cmd, input=request, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return TemplateVerdict(False, f"it did not finish rendering a short chat within {PROBE_TIMEOUT_S:.0f} s")
    except OSError as exc:
        # Not the template's fault: the per-render budgets still apply, so do not take chat away.
        logger.warning("Could not probe the chat template in a child process (%s); relying on the render limits.", exc)
        return _ACCEPTED
    try:
        answer = json.loads(proc.stdout)
        return TemplateVerdict(bool(answer["ok"]), str(answer.get("reason", "")))
    except (ValueError, KeyError, TypeError):
        return TemplateVerdict(False, _describe_exit(proc.returncode))


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        what = "it used up its CPU time" if name == "SIGXCPU" else f"the probe process was killed ({name})"
        return f"{what} while rendering a short chat"
    return f"the probe process failed (exit code {returncode}) while rendering a short chat"


class TemplateCheck:
    """One model's template probe, run in the background from load; `verdict()` waits for it."""

    def __init__(self, template: str | None, bos: str, eos: str, model: str) -> None:
        self.model = model
        self._verdict: TemplateVerdict | None = _ACCEPTED if template is None else None
        self._thread: threading.Thread | None = None
        if template is not None:
            self._thread = threading.Thread(
                target=self._run, args=(template, bos, eos), name="localspec-template-probe", daemon=True
            )
            self._thread.start()

    def _run(self, template: str, bos: str, eos: str) -> None:
        try:
            verdict = probe_template(template, bos, eos)
        except Exception:  # noqa: BLE001 - a bug of ours must not take chat away; the render limits remain
            logger.exception("The chat template probe failed")
            verdict = _ACCEPTED
        if not verdict.ok:
            logger.warning(
                "The chat template of %s was refused: %s. Chat requests will fail; raw prompts still work.",
                self.model, verdict.reason,
            )
        self._verdict = verdict

    def verdict(self) -> TemplateVerdict:
        if self._thread is not None:
            self._thread.join()
        return self._verdict or TemplateVerdict(False, "the probe ended without a verdict")

    def require(self) -> None:
        """Raise the request error a refused template means for a chat request."""
        verdict = self.verdict()
        if not verdict.ok:
            raise RequestError(
                f"The chat template of {self.model} was refused when the model loaded: {verdict.reason}.",
                "Send a raw prompt instead of chat messages (e.g. `localspec generate` without --chat, or "
                "/v1/completions), or use another GGUF of this model.",
            )
