#!/usr/bin/env bash
# Build the peer environments the latency benchmark compares against, OUTSIDE
# the repository (default /work/peers, override with HLOALIAS_PEERS_DIR):
#   $DIR/torch_xla-venv : torch 2.9.0 + torch-xla 2.9.0 (torch_xla 2.9 pins torch 2.9)
#   $DIR/torchax-venv   : torch 2.9.0 + torchax 0.0.13 + jax/jaxlib 0.10.2
#                         (torchax 0.0.13 does not import on torch 2.13)
# PyPI's torch 2.9.0 for Linux x86-64 is the CUDA build (no CPU variant on
# PyPI): it pulls the nvidia-* wheels, several GB, and runs on CPU as is.
# Each environment is built only when missing; `bench.peers` measures the
# ones present and reports the rest as "not measured".
# The machine-wide pip constraints (torch<=2.14) do not apply to torch 2.9.
set -euo pipefail
DIR="${HLOALIAS_PEERS_DIR:-/work/peers}"
PY="${PYTHON:-python3.11}"
mkdir -p "$DIR"

build() {  # build NAME PACKAGES...
    local name="$1"; shift
    local venv="$DIR/$name-venv"
    if [ -x "$venv/bin/python" ] && [ -f "$venv/.complete" ]; then
        echo "$name: $venv exists"; return 0
    fi
    rm -rf "$venv"
    "$PY" -m venv "$venv"
    "$venv/bin/pip" install --quiet --upgrade pip
    PIP_CONSTRAINT= "$venv/bin/pip" install --quiet "$@"
    touch "$venv/.complete"
    echo "$name: built $venv"
}

case "${1:-all}" in
    torch_xla|all) build torch_xla "torch==2.9.0" "torch-xla==2.9.0" numpy ;;&
    torchax|all) build torchax "torch==2.9.0" "torchax==0.0.13" "jax==0.10.2" "jaxlib==0.10.2" numpy ;;
    torch_xla) ;;
    *) echo "usage: $0 [all|torch_xla|torchax]" >&2; exit 2 ;;
esac
