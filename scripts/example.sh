#!/usr/bin/env bash
# The main job end to end on CPU PJRT: the torch_xla seed program through
# import -> hloalias passes -> XLA, printing the device bytes XLA allocated.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/venv.sh"
exec "$HLOALIAS_PYTHON" -W ignore::FutureWarning -m hloalias.tools.example "$@"
