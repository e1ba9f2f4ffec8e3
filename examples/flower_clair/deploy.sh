#!/usr/bin/env bash
# Run the flower_clair app on Flower's deployment engine on this machine: a SuperLink and N
# SuperNodes (insecure, localhost, free ports), `flwr run`, wait for the run, OUT/summary.json.
# Usage: examples/flower_clair/deploy.sh OUT [--nodes N] [--rounds R] [--kill-node I --kill-after S]
#                                            [--set KEY=VALUE ...] [--timeout SECONDS]
# Every process it starts is stopped at the end, on an error and on Ctrl-C (deploy.py).
set -euo pipefail
if [[ $# -lt 1 ]]; then
  echo "usage: $0 OUT [--nodes N] [--rounds R] [--kill-node I --kill-after S] [--set KEY=VALUE ...]" >&2
  exit 2
fi
here="$(cd "$(dirname "$0")" && pwd)"
export FLWR_TELEMETRY_ENABLED=0
exec python "$here/deploy.py" "$@"
