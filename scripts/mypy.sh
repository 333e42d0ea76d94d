#!/usr/bin/env bash
# Strict type check of the whole package as it is installed: hloalias/ with
# each layer folder (frontend/, passes/, pipeline/, runtime/, tools/) as a
# subpackage.  mypy cannot follow the editable install's import hook, so the
# check runs on a tree of symbolic links with that layout (build/mypy/).
# Configuration: [tool.mypy] in pyproject.toml.  Extra arguments go to mypy.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${HLOALIAS_PYTHON:-$repo_root/.venv/bin/python}"
tree="$repo_root/build/mypy"
rm -rf "$tree"
mkdir -p "$tree/hloalias"
for entry in "$repo_root"/hloalias/*; do
  case "$(basename "$entry")" in __pycache__) continue ;; esac
  ln -s "$entry" "$tree/hloalias/$(basename "$entry")"
done
for layer in frontend passes pipeline runtime tools; do
  ln -s "$repo_root/$layer" "$tree/hloalias/$layer"
done
cd "$tree"
exec "$python" -m mypy --config-file "$repo_root/pyproject.toml" --cache-dir "$repo_root/.mypy_cache" -p hloalias "$@"
