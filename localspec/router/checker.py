"""Checking an answer by running it: code against its unit tests, math against its number.

Code runs in a fresh `python -I` in a temporary directory, with a timeout, CPU and memory
limits, an empty environment and, where the kernel allows unprivileged namespaces, no network
(`unshare --net`). It is model output, so it is never imported into this process.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from localspec.router.answers import extract_code, extract_number
from localspec.router.tasks import Task

TIMEOUT_S = 10.0
CENT_SLACK = 0.005 + 1e-9  # half a cent, plus float noise ("0.38" for 0.375 is a rounding)
_MEMORY_BYTES = 1 << 30


@dataclass(frozen=True)
class CheckResult:
    passed: bool
    detail: str


def check(task: Task, text: str) -> CheckResult:
    if task.kind == "math":
        return check_math(task, text)
    return check_code(task, text)


def check_math(task: Task, text: str) -> CheckResult:
    got = extract_number(text)
    if got is None:
        return CheckResult(False, "no number in the answer")
    want = float(task.answer)  # type: ignore[arg-type]
    # The key, or the key rounded to cents: "55.56" answers 500/9 (stored as 55.555556). Nothing
    # further, however large the key: 8161 does not answer 8160 (a relative tolerance would).
    ok = abs(got - want) <= CENT_SLACK
    return CheckResult(ok, f"answered {got:g}, expected {want:g}")


def _limits() -> None:  # runs in the child before exec
    import resource

    resource.setrlimit(resource.RLIMIT_CPU, (int(TIMEOUT_S), int(TIMEOUT_S) + 1))
    resource.setrlimit(resource.RLIMIT_AS, (_MEMORY_BYTES, _MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))


@functools.cache
def _no_network_prefix() -> tuple[str, ...]:
    """`unshare --net --map-root-user` when it works here (containers often forbid it)."""
    exe = shutil.which("unshare")
    if exe is None:
        return ()
    try:
        ok = subprocess.run([exe, "--net", "--map-root-user", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return (exe, "--net", "--map-root-user") if ok else ()


def check_code(task: Task, text: str) -> CheckResult:
    code = extract_code(text)
    program = code + "\n\n" + "\n".join(task.tests) + "\nprint('ALL TESTS PASSED')\n"
    with tempfile.TemporaryDirectory(prefix="localspec-check-") as tmp:
        path = os.path.join(tmp, "solution.py")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(program)
        cmd = [*_no_network_prefix(), sys.executable, "-I", path]
        try:
            proc = subprocess.run(
                cmd, cwd=tmp, capture_output=True, text=True, timeout=TIMEOUT_S,
                env={"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0"},
                preexec_fn=_limits if os.name == "posix" else None,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return CheckResult(False, f"timed out after {TIMEOUT_S:g} s")
    if proc.returncode == 0 and "ALL TESTS PASSED" in proc.stdout:
        return CheckResult(True, "all tests passed")
    err = (proc.stderr.strip().splitlines() or ["exit status %d" % proc.returncode])[-1]
    return CheckResult(False, err[:200])
