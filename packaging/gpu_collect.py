"""Fold a GPU check's output directory into the one JSON that docs/gpu/ keeps (issue #30).

    python packaging/gpu_collect.py OUT_DIR docs/gpu/h200-2026-12-07.json

OUT_DIR is what the device tool brought back from gpu-device-run.sh: calibration.json,
predictions.json, engine.json (each present as far as the run got), environment.txt,
summary.txt and build.log (read only for how the libraries came: prebuilt or built there). The JSON says which steps are present, so a cut run is not mistaken for a whole one,
and which GPU ran it (nvidia-smi's line in environment.txt): a file named for one GPU (h200-...)
is refused when another ran it, since the device tool's first call gets an H100 unless the call
names nvidia-h200.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

PARTS = ("calibration", "predictions", "engine")
TEXTS = ("environment", "summary")
STEPS = {  # the value each step fills (file, key, inner key), in the order the check measures
    "offload_plan": ("calibration", "offload", "plans"),  # the product's split, planned and loaded (a GPU only)
    "sweep": ("calibration", "sweep", "verify_by_rows"),
    "sweep_long_context": ("calibration", "sweep_long_context", "verify_by_rows"),  # written empty before it runs
    "engine_calibration": ("calibration", "engine_calibration", "verify"),
    "predictions": ("predictions", "costs", None),
    "engine": ("engine", "runs", None),
    "batch_flips": ("engine", "batch_flips", "by_rows"),
    "second_target": ("engine", "second_target", "verify_by_rows"),
}


def collect(out_dir: Path) -> dict:
    result: dict = {}
    for part in PARTS:
        path = out_dir / f"{part}.json"
        if path.is_file():
            try:
                result[part] = json.loads(path.read_text())
            except ValueError as exc:  # cut off mid-write by an older check: keep the rest
                result.setdefault("unreadable", {})[path.name] = str(exc)
    for text in TEXTS:
        path = out_dir / f"{text}.txt"
        if path.is_file():
            result[text] = path.read_text().splitlines()
    result["gpu"] = gpu_seen(result.get("environment", []))
    build_log = out_dir / "build.log"
    result["libraries"] = libraries_used(build_log.read_text(errors="replace")) if build_log.is_file() else None
    result["steps_present"] = [step for step, where in STEPS.items() if _filled(result, *where)]
    return result


# nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version --format=csv, one row:
# "NVIDIA H200, 143771 MiB, 9.0, 580.159.03" (the header row has no digits in its third field).
_SMI_ROW = re.compile(r"^(?P<name>[^,]+), (?P<memory>\d+ MiB), (?P<compute_cap>\d+\.\d+), (?P<driver>[\d.]+)$")


def gpu_seen(environment: list[str]) -> dict[str, str] | None:
    """The first GPU nvidia-smi listed in environment.txt, or None (a CPU run, or no nvidia-smi)."""
    for line in environment:
        match = _SMI_ROW.match(line.strip())
        if match:
            return match.groupdict()
    return None


_NINJA_TOTAL = re.compile(r"^ninja_log: (?P<seconds>\d+)\tTOTAL \((?P<steps>\d+) steps\)$")


def libraries_used(build_log: str) -> str | None:
    """How the run got llama.cpp's libraries, from build.log: the prebuilt ones (gpu-check.sh says
    whether they loaded and offloaded, or why not) and/or a build there (ninja's compile seconds)."""
    lines = build_log.splitlines()
    parts = [line for line in lines if line.startswith("the prebuilt libraries")]
    totals = [m for line in lines if (m := _NINJA_TOTAL.match(line))]
    if totals:
        parts.append(f"built there: {totals[-1]['seconds']} compile-seconds over {totals[-1]['steps']} steps")
    return "; ".join(parts) or None


def name_mismatch(dest: Path, gpu: dict[str, str] | None) -> str | None:
    """Why `dest` (docs/gpu/<gpu>-<date>.json) misnames the run, or None when it names no GPU or the
    one nvidia-smi named. A GPU model in a file name is a word of letters then digits (h200, A100),
    and must be a whole word of the GPU's name ("NVIDIA H100 80GB HBM3"): h20 is not an H200."""
    tags = [word for word in re.split(r"[-_.\s]+", dest.stem.lower()) if re.fullmatch(r"[a-z]+\d+[a-z]*", word)]
    if not tags:
        return None  # a name without a GPU model claims nothing
    if gpu is None:
        return f"{dest.name} is named for {tags[0].upper()} but environment.txt shows no GPU"
    words = set(gpu["name"].lower().split())
    wrong = [tag for tag in tags if tag not in words]
    if wrong:
        return f"{dest.name} is named for {wrong[0].upper()} but the run came from {gpu['name']}"
    return None


def _filled(result: dict, part: str, key: str, inner: str | None) -> bool:
    value = result.get(part, {}).get(key)
    return bool(value.get(inner) if inner and isinstance(value, dict) else value)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Fold a GPU check's output directory into one JSON for docs/gpu/.")
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("dest", type=Path)
    args = ap.parse_args(argv)
    if not args.out_dir.is_dir():
        print(f"error: {args.out_dir} is not a directory; fix: give the folder the device tool's files came back in",
              file=sys.stderr)
        return 2
    result = collect(args.out_dir)
    if not result["steps_present"]:
        print(f"error: {args.out_dir} holds no measured step (see its summary.txt or check.log)", file=sys.stderr)
        return 1
    wrong = name_mismatch(args.dest, result["gpu"])
    if wrong:
        print(f"error: {wrong}; fix: name the file for the GPU that ran it (e.g. docs/gpu/h100-<date>.json)",
              file=sys.stderr)
        return 1
    args.dest.parent.mkdir(parents=True, exist_ok=True)
    args.dest.write_text(json.dumps(result, indent=1) + "\n")
    gpu = result["gpu"]["name"] if result["gpu"] else "no GPU"
    print(f"wrote {args.dest} ({gpu}): {', '.join(result['steps_present'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
