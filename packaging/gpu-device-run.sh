#!/usr/bin/env bash
# The one command for a borrowed GPU box (issue #30), run from the repository root there:
#   OUT=DIR bash packaging/gpu-device-run.sh [gpu-check.sh options]    ($OUT: the device tool sets it)
# Before, here: packaging/gpu-bundle.sh [--prebuilt] .gpu   (writes .gpu/localspec-gpu-check.tar.gz; .gpu/ is
# git-ignored, so the device call names it in `carry`). There it unpacks the bundle once, at a fixed
# path, and runs gpu-check.sh into OUT_DIR, so that a second call on the same warm machine finds the
# build done (or half done: ninja carries on) and spends its time measuring. Seven files come back
# (environment.txt, build.log, check.log, calibration.json, predictions.json, engine.json,
# summary.txt), under the device tool's limit of eight.
# Env: BUNDLE (default .gpu/localspec-gpu-check.tar.gz), UNPACK (default /tmp/localspec-gpu),
#      WORK (build + models, default /tmp/localspec-gpu-work), PYTHON (default python3),
#      BUDGET_S (default 330), BUILD_LIMIT_S (default 240); other arguments go to gpu-check.sh.
set -uo pipefail
BUNDLE=${BUNDLE:-.gpu/localspec-gpu-check.tar.gz}
UNPACK=${UNPACK:-/tmp/localspec-gpu}
OUTDIR=${OUT:-}
if [ -z "$OUTDIR" ]; then echo "error: set \$OUT to the output directory" >&2; exit 2; fi
if [ ! -f "$BUNDLE" ]; then
  echo "error: no bundle at $BUNDLE; fix: run packaging/gpu-bundle.sh .gpu here and carry .gpu" >&2
  exit 2
fi
# Unpack only a bundle not unpacked before: fresh files would make ninja rebuild everything.
sum=$(sha256sum "$BUNDLE" | cut -d' ' -f1)
if [ "$(cat "$UNPACK/.bundle-sha256" 2>/dev/null)" != "$sum" ]; then
  rm -rf "$UNPACK" && mkdir -p "$UNPACK" && tar xzf "$BUNDLE" -C "$UNPACK" || { echo "error: could not unpack $BUNDLE" >&2; exit 1; }
  echo "$sum" >"$UNPACK/.bundle-sha256"
  echo "unpacked $BUNDLE into $UNPACK"
else
  echo "reusing $UNPACK (same bundle)"
fi
export WORK=${WORK:-/tmp/localspec-gpu-work} PYTHON=${PYTHON:-python3}
export BUDGET_S=${BUDGET_S:-330} BUILD_LIMIT_S=${BUILD_LIMIT_S:-240} PYTHONUNBUFFERED=1
exec bash "$UNPACK/gpu-check.sh" "$@" "$OUTDIR"
