"""Fold a GPU check's output directory into the one JSON that docs/gpu/ keeps (issue #30).

    python packaging/gpu_collect.py OUT_DIR docs/gpu/h200-2026-12-07.json

OUT_DIR is what the device tool brought back from gpu-device-run.sh: calibration.json,
predictions.json, engine.json (each present as far as the run got), environment.txt and
summary.txt. The JSON says which steps are present, so a cut run is not mistaken for a whole one.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PARTS = ("calibration", "predictions", "engine")
TEXTS = ("environment", "summary")
STEPS = {  # the value each step fills (file, key, inner key), in the order the check measures
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
    result["steps_present"] = [step for step, where in STEPS.items() if _filled(result, *where)]
    return result


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
    args.dest.parent.mkdir(parents=True, exist_ok=True)
    args.dest.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.dest}: {', '.join(result['steps_present'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
