"""Render untrusted Jinja (a GGUF's chat template) with budgets the template cannot get past.

Jinja's immutable sandbox stops a template from reaching Python internals; it does not stop one
from running for hours or filling memory (`range` nested three deep, `'x' * 10**9`, a string
doubled in a loop). On top of the sandbox, every render here gets:

- a step budget: every iteration of every `{% for %}` loop (the parsed template is rewritten so
  each loop iterates through a meter), attribute or item lookup, call, filter, intercepted
  operator and output chunk costs steps, a filter or method in proportion to its input's size;
- size limits: no value and no output may exceed MAX_CHARS characters (MAX_ITEMS items for a
  container or range, MAX_INT_BITS for an integer); operators and filters that multiply sizes
  (`*`, `**`, `~`, `%`-widths, `center`, `indent`, `replace`, `join`, ...) are checked before they run;
- a data budget: the new strings a render reads back add up to at most DATA_BUDGET characters;
- a wall-clock limit of RENDER_SECONDS, checked as steps are spent.

What remains (work inside one C call under the limits, memory held by values the hooks never
see) is bounded by the load-time probe: `python -I template_sandbox.py --probe` renders sample
chats in a child process under a wall-clock, CPU and memory limit (see `chat.probe_template`).

Standalone on purpose (stdlib and jinja2 only): the probe runs this file in an isolated interpreter.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterable, Iterator
from datetime import datetime
from functools import update_wrapper
from typing import Any

from jinja2 import TemplateError, nodes
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

MAX_TEMPLATE_CHARS = 256 * 1024  # real chat templates are a few KB
MAX_CHARS = 4_000_000  # one value, and the whole output (~1M tokens: past any context)
MAX_ITEMS = 100_000
MAX_STEPS = 1_000_000
DATA_BUDGET = 64_000_000
MAX_INT_BITS = 256
MAX_WIDTH = 10_000  # width and count arguments: center, indent, ljust, batch, format widths, ...
MAX_NESTING = 64  # containers nested deeper than this count as over-size
RENDER_SECONDS = 10.0  # generous: real templates render in milliseconds
CHARS_PER_STEP = 16  # a filter or str method costs a step per this many characters (items) of input
RESERVED = "_localspec_"  # prefix of the guards the rewritten template calls; templates may not use it

PROBE_SECONDS = 3  # the probe's wall-clock limit inside the child
PROBE_MEMORY = 128 * 1024 * 1024  # address space the child may add while rendering (a sample chat needs ~10 MB)


class RenderLimitError(SecurityError):
    """A template ran past a render budget (steps, sizes or data)."""


class Budget:
    """What one render may still spend. Input strings (the conversation) are free to read."""

    def __init__(self) -> None:
        self.steps = 0
        self.data = 0
        self._inputs: set[int] = set()
        self._deadline = time.monotonic() + RENDER_SECONDS
        self._next_clock = 1024

    def exempt(self, inputs: Iterable[object]) -> None:
        """Strings of the conversation itself: reading them costs no data budget."""
        self._inputs.update(id(x) for x in inputs)

    def step(self, n: int = 1) -> None:
        self.steps += n
        if self.steps > MAX_STEPS:
            raise RenderLimitError(f"it ran past {MAX_STEPS:,} steps (a loop too long)")
        if self.steps >= self._next_clock:
            self._next_clock = self.steps + 1024
            if time.monotonic() > self._deadline:
                raise RenderLimitError(f"it ran longer than {RENDER_SECONDS:.0f} s")

    def charge(self, value: object) -> None:
        """One step, plus one per CHARS_PER_STEP characters or items a filter or method reads."""
        try:
            size = len(value) if isinstance(value, (str, list, tuple, dict, range)) else 0
        except OverflowError:  # a range longer than sys.maxsize
            size = MAX_STEPS * CHARS_PER_STEP
        self.step(1 + size // CHARS_PER_STEP)

    def observe(self, value: object) -> object:
        """Check a value the template produced or read; returns it."""
        if isinstance(value, str):
            _check_chars(len(value), "a string")
            if id(value) not in self._inputs:
                self.data += len(value)
                if self.data > DATA_BUDGET:
                    raise RenderLimitError(f"it built more than {DATA_BUDGET:,} characters of strings")
        elif isinstance(value, (list, tuple, dict, set, frozenset)) and len(value) > MAX_ITEMS:
            raise RenderLimitError(f"it built a container of {len(value):,} items (limit {MAX_ITEMS:,})")
        elif isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            raise RenderLimitError(f"it built an integer of {value.bit_length():,} bits")
        return value

    def weight(self, value: object, depth: int = 0) -> int:
        """Characters `str(value)` takes at least; stops counting past MAX_CHARS (steps pay for it)."""
        if isinstance(value, str):
            return len(value)
        if not isinstance(value, (list, tuple, dict)):
            return 1
        if depth > MAX_NESTING:  # said as such: "a tojson result of 4,000,130 characters" named no cause
            raise RenderLimitError(f"a value nested more than {MAX_NESTING} levels deep")
        self.step(len(value))
        total = len(value)
        # A dict's key and value sit one level down, as a list's items do (not two, as a (key, value) pair would).
        for item in (x for kv in value.items() for x in kv) if isinstance(value, dict) else value:
            total += self.weight(item, depth + 1)
            if total > MAX_CHARS:
                break
        return total


def _check_chars(n: int, what: str) -> None:
    if n > MAX_CHARS:
        raise RenderLimitError(f"{what} of {n:,} characters (limit {MAX_CHARS:,})")


def _check_width(n: object, what: str) -> None:
    if isinstance(n, int) and abs(n) > MAX_WIDTH:
        raise RenderLimitError(f"{what} of {n:,} (limit {MAX_WIDTH:,})")


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")
_BRACE_SPEC = re.compile(r"\{[^{}]*:([^{}]*)(\{?)")


def check_format(fmt: str) -> None:
    """Refuse %- and {}-format strings whose widths would build a huge string."""
    for width, precision in _PERCENT_SPEC.findall(fmt):
        for n in (width, precision):
            if n == "*":
                raise RenderLimitError("a format width taken from an argument ('*')")
            if n:
                _check_width(int(n), "a format width")
    for spec, nested in _BRACE_SPEC.findall(fmt):
        if nested:
            raise RenderLimitError("a format width taken from an argument")
        for n in re.findall(r"\d+", spec):
            _check_width(int(n), "a format width")


def _replace_size(s: str, old: str, new: str) -> int:
    return len(s) + (len(s) // max(len(old), 1) + 1) * len(new)


class MeteredLoop:
    """What a rewritten `{% for %}` iterates: the loop's iterable, one step per item."""

    __slots__ = ("_iterable", "_budget")

    def __init__(self, budget: Budget, iterable: Any) -> None:  # whatever the template loops over
        self._iterable, self._budget = iterable, budget

    def __iter__(self) -> Iterator[object]:
        for item in self._iterable:
            self._budget.step()
            yield item

    def __len__(self) -> int:  # loop.length, loop.last: as for the plain iterable
        return len(self._iterable)


class _Instrument(NodeTransformer):
    """Rewrite a parsed template: loops iterate through a meter, `~` joins through a size check."""

    def __init__(self, env: GuardedSandbox) -> None:
        self.env = env

    def _call(self, name: str, arg: nodes.Node, lineno: int) -> nodes.Call:
        call = nodes.Call(nodes.Name(RESERVED + name, "load"), [arg], [], None, None)
        # Every new node needs a line number: jinja maps tracebacks through them.
        call.set_lineno(lineno).set_environment(self.env)  # both set in place
        return call

    def visit_Name(self, node: nodes.Name) -> nodes.Name:
        if node.name.startswith(RESERVED):
            raise SecurityError(f"the template uses the reserved name {node.name!r}")
        return node

    def visit_For(self, node: nodes.For) -> nodes.For:
        self.generic_visit(node)  # rewrites the children in place
        node.iter = self._call("loop", node.iter, node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Call:
        self.generic_visit(node)
        return self._call("concat", nodes.List(node.nodes), node.lineno)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _size_precheck(name: str, budget: Budget, args: tuple, kwargs: dict) -> None:
    """Filters and str methods (`str.` + name) whose output can dwarf their input, checked before
    they run. `args` starts with the value (the filter's input, the method's string)."""
    base = name.removeprefix("str.")
    if base in ("center", "ljust", "rjust", "zfill", "batch", "slice", "truncate", "wordwrap"):
        for arg in (*args[1:], *kwargs.values()):
            _check_width(arg, f"the {base} argument")
    elif not args:
        return
    elif base == "indent" and isinstance(args[0], str):
        width = args[1] if len(args) > 1 else kwargs.get("width", 4)
        pad = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        _check_width(pad, "an indent")
        _check_chars(len(args[0]) + (args[0].count("\n") + 1) * pad, "an indented string")
    elif base == "expandtabs" and isinstance(args[0], str):
        size = args[1] if len(args) > 1 else kwargs.get("tabsize", 8)
        _check_width(size, "a tab size")
        _check_chars(len(args[0]) + args[0].count("\t") * (size if isinstance(size, int) else 8), "an expanded string")
    elif base == "replace" and len(args) >= 3 and all(isinstance(a, str) for a in args[:3]):
        _check_chars(_replace_size(*args[:3]), "a replaced string")
    elif name == "str.join" and len(args) > 1 and isinstance(args[1], (list, tuple)):
        _check_chars(budget.weight(args[1]) + len(args[0]) * len(args[1]), "a joined string")
    elif name == "join" and isinstance(args[0], (list, tuple)):
        sep = args[1] if len(args) > 1 else kwargs.get("d", "")
        _check_chars(budget.weight(args[0]) + budget.weight(sep) * len(args[0]), "a joined string")
    elif name in ("string", "tojson", "pprint"):
        _check_chars(budget.weight(args[0]), f"a {name} result")
    elif base in ("format", "format_map") and isinstance(args[0], str):
        check_format(args[0])


class GuardedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox with a budget on every hook it offers."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, budget: Budget) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True, finalize=self._finalize)
        self.budget = budget
        self.globals.pop("lipsum", None)  # builds text of any size; no chat template needs it
        self.globals["range"] = _capped_range
        self.globals[RESERVED + "loop"] = lambda iterable: MeteredLoop(budget, iterable)
        self.globals[RESERVED + "concat"] = self._concat
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = _strftime_now
        self.filters = {name: self._guard_filter(name, f) for name, f in self.filters.items()}

    def _parse(self, source, name, filename):
        return _Instrument(self).visit(super()._parse(source, name, filename))

    def _concat(self, parts: list) -> str:
        _check_chars(sum(self.budget.weight(p) for p in parts), "a concatenation")
        return "".join(map(str, parts))

    def unsafe_undefined(self, obj, attribute):
        # The stock sandbox renders `{{ f.__globals__ }}` as ''; refuse at once instead.
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")

    def _guard_filter(self, name: str, f):
        budget = self.budget

        def guarded(*args, **kwargs):
            # pass_context/eval_context/environment filters get that object first; skip it.
            value_args = args[1:] if getattr(f, "jinja_pass_arg", None) is not None else args
            budget.charge(value_args[0] if value_args else None)
            _size_precheck(name, budget, value_args, kwargs)
            return budget.observe(f(*args, **kwargs))

        return update_wrapper(guarded, f)

    def _finalize(self, value: object) -> object:
        if isinstance(value, (list, tuple, dict)):
            _check_chars(self.budget.weight(value), "an output value")
        return value

    def getattr(self, obj, attribute):
        self.budget.step()
        return self.budget.observe(super().getattr(obj, attribute))

    def getitem(self, obj, argument):
        self.budget.step()
        return self.budget.observe(super().getitem(obj, argument))

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's own signature)
        target = getattr(__obj, "__wrapped__", __obj)
        owner = getattr(target, "__self__", None)
        __self.budget.charge(owner if isinstance(owner, (str, list, tuple, dict)) else None)
        if isinstance(owner, str):
            _size_precheck(f"str.{target.__name__}", __self.budget, (target.__self__, *args), kwargs)
        return __self.budget.observe(super().call(__context, __obj, *args, **kwargs))

    def wrap_str_format(self, value):
        wrapped = super().wrap_str_format(value)
        if wrapped is not None:
            check_format(value.__self__)
        return wrapped

    def call_binop(self, context, operator: str, left, right):
        self.budget.step()
        _binop_precheck(self.budget, operator, left, right)
        return self.budget.observe(super().call_binop(context, operator, left, right))


def _binop_precheck(budget: Budget, op: str, left: object, right: object) -> None:
    sized = (str, list, tuple)
    if op == "*":
        seq, n = (left, right) if isinstance(left, sized) else (right, left)
        if isinstance(seq, sized) and isinstance(n, int) and n > 0:
            _check_chars(budget.weight(seq) * n, "a repeated value")
            if len(seq) * n > MAX_ITEMS and not isinstance(seq, str):
                raise RenderLimitError(f"a repeated list of {len(seq) * n:,} items (limit {MAX_ITEMS:,})")
        elif isinstance(left, int) and isinstance(right, int) and left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise RenderLimitError("a product too large")
    elif op == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
        if right * left.bit_length() > MAX_INT_BITS:
            raise RenderLimitError(f"a power too large (a {left.bit_length()}-bit number ** {right})")
    elif op == "+" and isinstance(left, sized) and isinstance(right, sized):
        _check_chars(len(left) + len(right) if isinstance(left, str) else budget.weight(left) + budget.weight(right),
                     "a concatenation")
    elif op == "%" and isinstance(left, str):
        check_format(left)


def _capped_range(*args: int) -> range:
    rng = range(*args)
    try:
        n = len(rng)
    except OverflowError:
        n = MAX_STEPS * CHARS_PER_STEP
    if n > MAX_ITEMS:
        raise RenderLimitError(f"a range of {n:,} items (limit {MAX_ITEMS:,})")
    return rng


def _strings(value: object, found: list[object]) -> list[object]:
    """The strings inside the variables (the conversation): reading them costs no data budget."""
    if isinstance(value, str):
        found.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _strings(v, found)
    elif isinstance(value, dict):
        for v in value.values():
            _strings(v, found)
    return found


def render(template: str, variables: dict[str, object]) -> str:
    """Render untrusted template text under the budgets.

    Raises RenderLimitError past a budget, SecurityError for unsafe access, TemplateError for the
    template's own errors; other exceptions (a TypeError in the template) pass through.
    """
    if len(template) > MAX_TEMPLATE_CHARS:
        raise RenderLimitError(f"the template has {len(template):,} characters (limit {MAX_TEMPLATE_CHARS:,})")
    budget = Budget()
    budget.exempt(_strings(variables, []))
    env = GuardedSandbox(budget)
    try:
        chunks: list[str] = []
        size = 0
        for chunk in env.from_string(template).generate(**variables):
            budget.step()
            size += len(chunk)
            _check_chars(size, "an output")
            chunks.append(chunk)
        return "".join(chunks)
    except RecursionError as exc:
        raise RenderLimitError("it recursed too deeply") from exc
    except MemoryError as exc:
        raise RenderLimitError("it ran out of memory") from exc


# ---------------------------------------------------------------------- the load-time probe

_SAMPLE_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city."}},
                   "required": ["city"]}}}]


def sample_chats() -> list[dict[str, object]]:
    """Conversations a chat template must render quickly: with and without a system prompt and tools.
    The contents are long enough (a few KB) that work growing with them shows within the limits."""
    para = "A paragraph of an ordinary chat message, with some words and numbers 1 2 3. " * 40
    turns = [{"role": "user", "content": "Hello! " + para}, {"role": "assistant", "content": "Hi. " + para},
             {"role": "user", "content": "Tell me more. " + para}]
    system = [{"role": "system", "content": "You are a helpful assistant. " + para}]
    return [{"messages": system + turns}, {"messages": turns}, {"messages": system + turns, "tools": _SAMPLE_TOOLS}]


_alarm = {"rang": False}  # set by the probe's wall-clock alarm, whatever exception it surfaced as


def probe(template: str, bos: str, eos: str) -> str | None:
    """Render the sample chats; the reason the template must be refused, or None.

    The template's own errors (a role it does not support, tools it does not take) are not reasons:
    they reach the request that triggers them as a clear error. Running past a budget, touching
    something unsafe, running out of memory or time are.
    """
    for chat in sample_chats():
        try:
            render(template, {"bos_token": bos, "eos_token": eos, "add_generation_prompt": True, **chat})
        except SecurityError as exc:  # RenderLimitError included
            return _alarm_reason() or str(exc)
        except (MemoryError, RecursionError) as exc:
            return _alarm_reason() or f"it ran out of {'memory' if isinstance(exc, MemoryError) else 'stack'}"
        except Exception:  # noqa: BLE001 - the template's own bug, reported per request
            if _alarm["rang"]:
                return _alarm_reason()
    return _alarm_reason()


def _alarm_reason() -> str | None:
    return f"it ran longer than {PROBE_SECONDS} s" if _alarm["rang"] else None


def _limit_child() -> None:
    """Wall clock, CPU and memory limits for this (probe) process, where the platform has them."""
    try:
        import resource
        import signal
    except ImportError:  # pragma: no cover - not POSIX
        return

    def on_alarm(_signum, _frame):
        _alarm["rang"] = True
        raise RenderLimitError(f"it ran longer than {PROBE_SECONDS} s")

    def lower(limit: int, soft: int) -> None:
        """Lower a soft limit, never above the hard limit already in force."""
        _, hard = resource.getrlimit(limit)
        resource.setrlimit(limit, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))

    signal.signal(signal.SIGALRM, on_alarm)
    # Repeats: a first alarm that lands inside a jinja `except Exception` (constant folding) is lost.
    signal.setitimer(signal.ITIMER_REAL, PROBE_SECONDS, 0.25)
    used = resource.getrusage(resource.RUSAGE_SELF)
    lower(resource.RLIMIT_CORE, 0)
    lower(resource.RLIMIT_CPU, int(used.ru_utime + used.ru_stime) + PROBE_SECONDS + 2)  # SIGXCPU: stuck in C
    try:
        with open("/proc/self/statm") as f:
            vm_now = int(f.read().split()[0]) * resource.getpagesize()
        lower(resource.RLIMIT_AS, vm_now + PROBE_MEMORY)
    except OSError:  # pragma: no cover - no /proc: the CPU and wall-clock limits remain
        pass


def probe_main() -> int:
    """The probe child: {template, bos, eos} as JSON on stdin, {ok, reason} as JSON on stdout."""
    request = json.loads(sys.stdin.read())
    _limit_child()
    reason = probe(request["template"], request.get("bos", ""), request.get("eos", ""))
    try:
        import signal

        signal.setitimer(signal.ITIMER_REAL, 0)
    except ImportError:  # pragma: no cover - not POSIX
        pass
    sys.stdout.write(json.dumps({"ok": reason is None, "reason": reason or ""}))
    return 0


if __name__ == "__main__":
    if sys.argv[1:] != ["--probe"]:
        sys.exit("usage: python -I template_sandbox.py --probe < {template, bos, eos} as JSON")
    sys.exit(probe_main())
