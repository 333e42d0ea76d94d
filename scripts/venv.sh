# Sourced by the other scripts: make sure .venv exists with hloalias and its
# pinned dependencies installed (editable), then export HLOALIAS_PYTHON.
# Reinstalls when pyproject.toml, setup.py or the native call path's source
# (runtime/_lane.cpp) change.  Never pulls a CUDA build of torch:
# the CPU wheel is taken from /opt/wheels when present, and the project pins
# torch==2.13.0, which that wheel satisfies.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo_root/.venv"
python_bin="${HLOALIAS_BOOTSTRAP_PYTHON:-python3.11}"
command -v "$python_bin" >/dev/null 2>&1 || python_bin=python3
stamp="$venv/.hloalias-installed"
# The native call path (runtime/_lane.cpp, built by setup.py against the
# installed torch) is rebuilt when its source or build changes, too.
want="$(cat "$repo_root/pyproject.toml" "$repo_root/setup.py" "$repo_root/runtime/_lane.cpp" | sha256sum | cut -d' ' -f1)"
# This project's machines have a C++ compiler: a native path that does not
# build is an error here (HLOALIAS_REQUIRE_NATIVE=0 lets the install go on
# without it, every call on the Python path).
export HLOALIAS_REQUIRE_NATIVE="${HLOALIAS_REQUIRE_NATIVE:-1}"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[hloalias] setting up $venv (first use; takes a few minutes)" >&2
  [ -x "$venv/bin/python" ] || "$python_bin" -m venv "$venv"
  find_links=()
  [ -d /opt/wheels ] && find_links=(--find-links /opt/wheels)
  "$venv/bin/python" -m pip install -q --upgrade pip </dev/null
  "$venv/bin/python" -m pip install -q "${find_links[@]}" "torch==2.13.0" </dev/null
  # The extension builds against the torch just installed: no isolated
  # build environment (it would fetch another torch).
  "$venv/bin/python" -m pip install -q "setuptools>=68" wheel "numpy>=2" </dev/null
  "$venv/bin/python" -m pip install -q "${find_links[@]}" --no-build-isolation -e "$repo_root[test,bench]" </dev/null
  echo "$want" >"$stamp"
fi
# Byte-compile hloalias's own layers (an editable install leaves them as
# source, and PYTHONDONTWRITEBYTECODE, set on this project's machines, keeps
# Python from caching them: every process then compiled ~1.3 MB of source,
# ~17 ms of it inside the first compile, where decompositions.py and the
# dialect modules are imported on first use).  checked-hash: Python hashes
# the source at import and ignores a .pyc that does not match it, so an edit
# is never run stale, whatever its timestamp.  Quick when nothing changed.
"$venv/bin/python" -m compileall -q -j0 --invalidation-mode checked-hash \
  "$repo_root/hloalias" "$repo_root/frontend" "$repo_root/passes" "$repo_root/pipeline" \
  "$repo_root/runtime" "$repo_root/bench" >/dev/null
export HLOALIAS_PYTHON="$venv/bin/python"
