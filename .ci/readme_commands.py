"""Print the README's set-up commands, one per line, exactly as the README writes them.

CI runs these and nothing else to install and test: the first ```bash block under the heading that
contains "Set-up", its non-comment lines, which must be exactly two (install and run; test).
Standard library only: it runs before any venv exists.
"""

from __future__ import annotations

import sys
from pathlib import Path

HEADING = "Set-up"
EXPECTED = 2


def setup_commands(readme: str) -> list[str]:
    lines = readme.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith("#") and HEADING in line)
        fence = next(i for i in range(start, len(lines)) if lines[i].strip() == "```bash")
        end = next(i for i in range(fence + 1, len(lines)) if lines[i].strip() == "```")
    except StopIteration:
        raise SystemExit(f"README: no ```bash block under a heading containing {HEADING!r}") from None
    commands = [line for line in lines[fence + 1:end] if line.strip() and not line.lstrip().startswith("#")]
    if len(commands) != EXPECTED:
        raise SystemExit(f"README: the set-up block has {len(commands)} commands, expected {EXPECTED}")
    return commands


if __name__ == "__main__":
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "README.md")
    print("\n".join(setup_commands(path.read_text(encoding="utf-8"))))
