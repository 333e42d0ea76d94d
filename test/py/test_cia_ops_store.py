"""torch's walk over every registered operator for the preservable
composite-implicit (CIA) set, kept across processes
(``torch_internals.CIA_OPS_STORE``, installed by
``runtime/program_cache.py``): a process with the operator registry of an
earlier one gets that process's set without walking, equal to torch's own
walk; a registry that differs (a new CIA operator) walks and finds it, and
processes of the two registries alternating keep both entries (one per
registry, the last ``CIA_OPS_ENTRIES`` written kept); an entry that names
an operator this process lacks is walked past; with the disk cache off
every process walks.  Fresh processes (the in-process
cache would answer otherwise)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_SCRIPT = """
import importlib, json, sys
import torch
import torch._export.utils as export_utils
from hloalias.frontend import torch_internals
import hloalias.runtime.program_cache  # installs the store

torch_internals._private()  # its imports register operators: before anything is counted
{prelude}
original = export_utils._collect_all_valid_cia_ops
modules = [importlib.import_module(name) for name in torch_internals._CIA_COLLECTORS]
walks = []

def counted():
    walks.append(1)
    return original()

for module in modules:
    module._collect_all_valid_cia_ops = counted
try:
    with torch_internals.materialize_cia_ops_once():
        ours = export_utils._collect_all_valid_cia_ops()
finally:
    for module in modules:
        module._collect_all_valid_cia_ops = original
theirs = original()  # torch's own walk, unpatched
names = lambda ops: sorted(f"{{op._schema.name}}.{{op._overloadname}}" for op in ops)
print(json.dumps({{"walks": len(walks), "equal": ours == theirs, "count": len(ours), "ours": names(ours)}}))
"""


def _run(tmp_path: Path, prelude: str = "", **env: str) -> dict[str, object]:
    environment = dict(os.environ, HLOALIAS_CACHE_DIR=str(tmp_path / "cache"),
                       HLOALIAS_CACHE_KEY_FILE=str(tmp_path / "keys" / "cache-key"), **env)
    script = _SCRIPT.format(prelude=textwrap.dedent(prelude))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environment,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    answer: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


_NEW_OPERATOR = """
library = torch.library.Library("hloalias_test_store", "DEF")
library.define("twice(Tensor x) -> Tensor")
library.impl("twice", lambda x: x * 2, "CompositeImplicitAutograd")
"""


def test_a_second_process_gets_the_stored_set_without_walking(tmp_path: Path) -> None:
    first = _run(tmp_path)
    assert first["walks"] == 1 and first["equal"] and first["count"] > 400
    second = _run(tmp_path)
    assert second["walks"] == 0  # answered from the first process's entry
    assert second["equal"] and second["ours"] == first["ours"]


def test_a_new_cia_operator_changes_the_key_and_is_found(tmp_path: Path) -> None:
    assert _run(tmp_path)["walks"] == 1
    with_op = _run(tmp_path, _NEW_OPERATOR)
    assert with_op["walks"] == 1 and with_op["equal"]
    assert "hloalias_test_store::twice.default" in with_op["ours"]  # type: ignore[operator]
    assert _run(tmp_path, _NEW_OPERATOR)["walks"] == 0  # and is stored under its own key


def test_an_entry_naming_a_missing_operator_is_walked_past(tmp_path: Path) -> None:
    assert _run(tmp_path)["walks"] == 1
    # The same registry's key, an entry written by hloalias's own writer (so
    # authentic) that names an operator this process does not have.
    forged = """
    export_utils._materialize_cpp_cia_ops()
    key = torch_internals._cia_store_key(torch_internals.registry_key())
    torch_internals.CIA_OPS_STORE[0][1](key, json.dumps(["hloalias_no_such::op.default"]).encode())
    """
    answer = _run(tmp_path, forged)
    assert answer["walks"] == 1 and answer["equal"]


def test_with_the_disk_cache_off_every_process_walks(tmp_path: Path) -> None:
    assert _run(tmp_path, HLOALIAS_CACHE="0")["walks"] == 1
    assert _run(tmp_path, HLOALIAS_CACHE="0")["walks"] == 1


def test_processes_of_two_registries_alternating_keep_both_entries(tmp_path: Path) -> None:
    # One entry per registry: a process without the operator library and one
    # with it, taking turns, each find their own set (a single entry would be
    # replaced by the other's at every start, and every process would walk).
    assert _run(tmp_path)["walks"] == 1
    assert _run(tmp_path, _NEW_OPERATOR)["walks"] == 1
    plain = _run(tmp_path)
    assert plain["walks"] == 0 and plain["equal"]
    with_op = _run(tmp_path, _NEW_OPERATOR)
    assert with_op["walks"] == 0 and with_op["equal"]
    assert "hloalias_test_store::twice.default" in with_op["ours"]  # type: ignore[operator]


def test_stored_sets_are_bounded_the_least_recently_written_going(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hloalias.runtime import disk_cache, program_cache

    monkeypatch.setenv("HLOALIAS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HLOALIAS_CACHE_KEY_FILE", str(tmp_path / "keys" / "cache-key"))
    monkeypatch.delenv("HLOALIAS_CACHE", raising=False)
    folder = tmp_path / "keys"
    keys = [f"{index:02x}" * 32 for index in range(program_cache.CIA_OPS_ENTRIES + 3)]
    for index, key in enumerate(keys):
        assert program_cache._write_cia_ops(key, f"[{index}]".encode())
        # Older than every later write, whatever the file system's time resolution.
        written = folder / (program_cache._cia_ops_name(key) + program_cache.CIA_OPS_SUFFIX)
        os.utime(written, ns=(index, index))
    left = sorted(path.name for path in folder.glob("cia-ops*" + program_cache.CIA_OPS_SUFFIX))
    assert len(left) == program_cache.CIA_OPS_ENTRIES
    assert [program_cache._read_cia_ops(key) for key in keys[:3]] == [None] * 3
    assert program_cache._read_cia_ops(keys[-1]) == f"[{len(keys) - 1}]".encode()
    assert program_cache._read_cia_ops(keys[3]) == b"[3]"
    assert disk_cache.prune_beside_key("cia-ops", program_cache.CIA_OPS_SUFFIX, 1) and \
        len(list(folder.glob("cia-ops*"))) == 1
