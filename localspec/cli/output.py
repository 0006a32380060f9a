"""What the verbs print: JSON, tables that fit the terminal without hiding an id, and a quiet end
when the reader of a pipe goes away (`localspec models list | head -1`)."""

from __future__ import annotations

import functools
import json
import os
import re
import select
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localspec.errors import LocalspecError

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.table import Table

# Pipes and logs without COLUMNS keep whole rows on one line, so scripts can grep them.
PIPE_WIDTH = 400
# Exit status of a program stopped because the reader of its output went away (128 + SIGPIPE),
# what the shell reports for `yes | head -1`.
EXIT_PIPE_CLOSED = 141


_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # all but tab and newline: escapes among them


def printable(text: str) -> str:
    """Text for a terminal: control characters (escape sequences included) shown as U+FFFD. Model output
    and a GGUF's metadata are untrusted: raw, "\x1b]0;...\x07" set the window title and "\x1b[2J" cleared it."""
    return _CONTROLS.sub("\ufffd", text)


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=str, ensure_ascii=False))


@contextmanager
def writing_file(path: Path, what: str) -> Iterator[None]:
    """A file the user named for output that cannot be written (a directory, a folder that does not
    exist, no permission) as one line naming it, not a traceback. `what`: the flag or argument."""
    try:
        yield
    except OSError as exc:
        raise LocalspecError(f"Cannot write {path} ({what}): {exc.strerror or exc}.",
                             "Give a file path in an existing directory you can write to.") from None


def output_width() -> int | None:
    """Columns to fit: the terminal's (rich reads it, and COLUMNS), COLUMNS for a pipe, else None."""
    if sys.stdout.isatty():
        return None
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else PIPE_WIDTH


@functools.cache
def _console_class() -> type[Console]:
    from rich.console import Console

    class PipeAwareConsole(Console):
        def on_broken_pipe(self) -> None:  # rich would exit with status 1; main() ends with 141 instead
            raise BrokenPipeError

    return PipeAwareConsole


def text_width() -> int:
    """Columns for plain text: the terminal's, COLUMNS for a pipe, else PIPE_WIDTH (no wrapping)."""
    import shutil

    return output_width() or shutil.get_terminal_size().columns


def table_console() -> Console:
    console_class, width = _console_class(), output_width()
    return console_class() if width is None else console_class(width=width, soft_wrap=False)


def print_renderable(renderable: RenderableType, console: Console | None = None) -> None:
    """Print a rich table or text; off a terminal, without colour or the padding after each row."""
    console = console or table_console()
    if console.is_terminal:
        console.print(renderable)
        return
    with console.capture() as captured:
        console.print(renderable)
    text = "\n".join(line.rstrip() for line in captured.get().splitlines())
    sys.stdout.write(text + "\n")


def table_fits(table: Table, console: Console) -> bool:
    """Whether the table's natural width fits the console (else rich would squeeze, cut or drop columns)."""
    from rich.measure import Measurement

    unbounded = console.options.update_width(1 << 16)  # measure at the natural width, not clamped to the console
    return Measurement.get(console, unbounded, table).maximum <= console.width


def _plain(cell: object) -> str:
    from rich.text import Text

    if isinstance(cell, Text):
        return cell.plain
    return Text.from_markup(cell).plain if isinstance(cell, str) else str(cell)


def stacked(table: Table, width: int) -> str:
    """The table as one block per row: the first cell (an id or a name) whole on its own line, then
    `header value` pairs wrapped beneath it. Nothing is cut, whatever the width."""
    headers = [_plain(c.header) for c in table.columns]
    columns = [[_plain(cell) for cell in c.cells] for c in table.columns]
    lines = [_plain(table.title)] if table.title else []
    for row in zip(*columns, strict=True):
        lines.append(row[0])
        lines += _pack([f"{h} {v}" for h, v in zip(headers[1:], row[1:], strict=True) if v], width - 2)
    return "\n".join(lines)


def _pack(fields: list[str], width: int) -> list[str]:
    """`fields` joined by "; " into indented lines of at most `width`, breaking only between fields
    (a field longer than a line gets a line of its own)."""
    lines: list[str] = []
    line = ""
    for field in fields:
        joined = f"{line}; {field}" if line else field
        if line and len(joined) + 1 > width:  # +1: the ";" that ends a broken line
            lines.append(f"  {line};")
            line = field
        else:
            line = joined
    return [*lines, f"  {line}"] if line else lines


def print_table(table: Table) -> None:
    """A table when it fits the width, else `stacked`: ids and names are never cut to "…"."""
    console = table_console()
    for col in table.columns:
        col.no_wrap = True
    if table_fits(table, console):
        print_renderable(table, console)
    else:
        from rich.text import Text

        print_renderable(Text(stacked(table, console.width)), console)  # Text: no markup, no highlighting


def stdout_reader_gone() -> bool:
    """True when standard output is a pipe or socket whose reader has closed it."""
    stdout = sys.__stdout__
    if stdout is None:
        return True  # no stdout: the broken pipe can only have been ours
    try:
        fd = stdout.fileno()
        poller = select.poll()
    except (AttributeError, ValueError, OSError):
        return True  # no poll (Windows) or a closed stdout: as above
    poller.register(fd, select.POLLOUT)
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))


def silence_stdout() -> None:
    """Point standard output at /dev/null, so that the interpreter's last flush has nowhere to fail."""
    stdout = sys.__stdout__
    if stdout is None:
        return  # no stdout: nothing to flush
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stdout.fileno())
        os.close(devnull)
    except (AttributeError, ValueError, OSError):
        pass
