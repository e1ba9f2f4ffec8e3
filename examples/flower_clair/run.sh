#!/usr/bin/env bash
# Run the flower_clair app end to end on Flower's simulation engine (CPU) and write OUTDIR/summary.json.
# Usage: examples/flower_clair/run.sh OUTDIR [--set KEY=VALUE ...]   (needs pip install ".[flower,peft]")
set -euo pipefail
if [[ $# -lt 1 ]]; then
  echo "usage: $0 OUTDIR [--set KEY=VALUE ...]" >&2
  exit 2
fi
here="$(cd "$(dirname "$0")" && pwd)"
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
export FLWR_TELEMETRY_ENABLED=0
exec python "$here/run.py" "$@"
