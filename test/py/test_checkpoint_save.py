"""``hloalias.checkpoint.save`` is all or nothing: cut short anywhere (a
Ctrl-C at every point Python checks for one, a full disk as a file is
written), the checkpoint directory holds exactly the earlier checkpoint,
complete and loadable, or exactly the new one, and nothing a save staged
is left beside it.  A directory that holds more than a checkpoint is
refused (it would be replaced), naming the file.

The earlier checkpoint of the sweeps is one saved by two processes (two
shard files): the save replaces files a single process does not write.
Before, the files were replaced in place one by one: a save cut between
its shard file and ``metadata.json`` left new shards beside the earlier
metadata (and the earlier second process's file), which ``load`` read as
a mix or refused.  The same sweep on a mesh: test_mesh_interrupts.py."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import hloalias
from hloalias import interrupts
from hloalias.errors import ExecutionError, HloaliasError
from hloalias.runtime import checkpoint, distributed, executable as executable_module
from interrupt_points import sweep

#: The save's own code and what it calls of ours (the state's read, the
#: deferred regions).
SAVE_FILES = {f.__file__ for f in (checkpoint, executable_module, interrupts, distributed)}


class _Counted(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("total", torch.zeros(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.total.add_(self.lin(x))
        return self.total * 1


def _program() -> Any:
    return hloalias.compile(_Counted(), (torch.ones(4, 4),))


def write_as_two_processes(values: dict[str, torch.Tensor], directory: Path) -> None:
    """``values`` as a checkpoint saved by two processes: each tensor's
    first rows in ``shards-0.pt``, the rest in ``shards-1.pt`` (the
    format of the module docstring)."""
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    files: list[dict[str, Any]] = [{}, {}]
    for name, value in values.items():
        rows = value.shape[0] if value.dim() else 1
        split = rows // 2 if value.dim() and rows > 1 else rows
        parts = [(0, split), (split, rows)] if split < rows else [(0, rows)]
        for rank, (start, stop) in enumerate(parts):
            index = [[start, stop], *([0, n] for n in value.shape[1:])] if value.dim() else []
            data = value[start:stop].clone() if value.dim() else value.clone()
            files[rank].setdefault(name, []).append({"index": index, "data": data})
        for rank in range(len(parts), 2):
            files[rank].setdefault(name, [])
    for rank, shards in enumerate(files):
        torch.save(shards, directory / f"shards-{rank}.pt")
    tensors = {
        name: {"shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}
        for name, value in values.items()
    }
    (directory / "metadata.json").write_text(json.dumps(
        {"format": checkpoint.FORMAT, "version": checkpoint.VERSION, "process_count": 2, "tensors": tensors}
    ))


def _same(now: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> bool:
    return sorted(now) == sorted(expected) and all(torch.equal(now[n], expected[n]) for n in now)


def _check_whole(target: Path, old: dict[str, torch.Tensor], new: dict[str, torch.Tensor], where: Any) -> str:
    """The checkpoint at ``target`` is exactly ``old`` or exactly ``new``
    and nothing else is beside it; returns which."""
    try:
        now = checkpoint.read(target)
    except ExecutionError as error:
        raise AssertionError(f"the checkpoint does not load after {where}: {error}") from None
    assert sorted(os.listdir(target.parent)) == [target.name], (where, os.listdir(target.parent))
    if _same(now, old):
        return "old"
    assert _same(now, new), f"the checkpoint is neither the earlier one nor the new one after {where}"
    return "new"


def test_a_save_interrupted_anywhere_leaves_the_old_or_the_new_checkpoint(tmp_path: Path) -> None:
    exe = _program()
    exe(torch.ones(4, 4))
    target = tmp_path / "root" / "ckpt"
    checkpoint.save(exe, tmp_path / "first")
    old = checkpoint.read(tmp_path / "first")
    shutil.rmtree(tmp_path / "first")
    new: dict[str, torch.Tensor] = {}
    seen: set[str] = set()

    def prepare() -> None:
        exe(torch.ones(4, 4))  # the state moves on from the earlier checkpoint
        write_as_two_processes(old, target)
        new.clear()
        new.update({name: value.clone() for name, value in exe.state_dict().items()})

    def check(_: None, where: Any) -> None:
        seen.add(_check_whole(target, old, new, where))

    points = sweep(prepare, lambda _: checkpoint.save(exe, target), check, SAVE_FILES)
    assert any(name == "save" for name, _, _ in points), points
    assert seen == {"old", "new"}, seen
    # The last run saved: it loads into a fresh program as the state it saved.
    fresh = _program()
    checkpoint.load(fresh, target)
    for name, value in fresh.state_dict().items():
        assert torch.equal(value, new[name]), name


def test_a_save_that_creates_the_directory_interrupted_anywhere_leaves_none_or_the_new_one(
    tmp_path: Path,
) -> None:
    exe = _program()
    exe(torch.ones(4, 4))
    target = tmp_path / "root" / "ckpt"
    new = {name: value.clone() for name, value in exe.state_dict().items()}

    def prepare() -> None:
        if target.exists():
            shutil.rmtree(target)

    def check(_: None, where: Any) -> None:
        if target.exists():
            assert _same(checkpoint.read(target), new), where
        if target.parent.exists():
            assert set(os.listdir(target.parent)) <= {target.name}, (where, os.listdir(target.parent))

    sweep(prepare, lambda _: checkpoint.save(exe, target), check, SAVE_FILES)


def _full_disk(*_: Any, **__: Any) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("failing", ["shards", "metadata"])
def test_a_save_on_a_full_disk_keeps_the_earlier_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """The disk fills as the shard file or as ``metadata.json`` is
    written: the save raises it, the earlier checkpoint loads whole, and
    nothing the save wrote is left.  Before, a full disk at the metadata
    left the new shard file beside the earlier metadata."""
    exe = _program()
    exe(torch.ones(4, 4))
    old = {name: value.clone() for name, value in exe.state_dict().items()}
    target = tmp_path / "ckpt"
    write_as_two_processes(old, target)
    exe(torch.ones(4, 4))
    if failing == "shards":
        real_save = torch.save

        def partial(value: Any, file: Any, *args: Any, **kwargs: Any) -> None:
            real_save(value, file, *args, **kwargs)
            with open(file, "r+b") as handle:  # half of it reached the disk
                handle.truncate(os.path.getsize(file) // 2)
            _full_disk()

        monkeypatch.setattr(torch, "save", partial)
    else:
        monkeypatch.setattr(json, "dump", _full_disk)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.save(exe, target)
    monkeypatch.undo()
    assert _same(checkpoint.read(target), old)
    assert sorted(os.listdir(tmp_path)) == ["ckpt"], os.listdir(tmp_path)
    assert sorted(os.listdir(target)) == ["metadata.json", "shards-0.pt", "shards-1.pt"]
    checkpoint.save(exe, target)
    assert _same(checkpoint.read(target), {n: v.clone() for n, v in exe.state_dict().items()})


def test_a_directory_holding_other_files_is_refused_not_replaced(tmp_path: Path) -> None:
    exe = _program()
    target = tmp_path / "run"
    checkpoint.save(exe, target)
    (target / "notes.txt").write_text("mine")
    with pytest.raises(HloaliasError, match=r"notes\.txt' is not a file of a checkpoint"):
        checkpoint.save(exe, target)
    assert (target / "notes.txt").read_text() == "mine"
    checkpoint.read(target)  # the earlier checkpoint, untouched
    plain = tmp_path / "file"
    plain.write_text("x")
    with pytest.raises(HloaliasError, match="'.*file' exists and is not a directory"):
        checkpoint.save(exe, plain)
    assert sorted(os.listdir(tmp_path)) == ["file", "run"]


def test_a_save_through_a_link_replaces_the_directory_it_names(tmp_path: Path) -> None:
    exe = _program()
    checkpoint.save(exe, tmp_path / "step-1")
    (tmp_path / "latest").symlink_to(tmp_path / "step-1")
    exe(torch.ones(4, 4))
    checkpoint.save(exe, tmp_path / "latest")
    assert (tmp_path / "latest").is_symlink()
    assert _same(checkpoint.read(tmp_path / "step-1"), {n: v.clone() for n, v in exe.state_dict().items()})
    assert sorted(os.listdir(tmp_path)) == ["latest", "step-1"]


def test_the_two_rename_replacement_is_all_or_nothing_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the system cannot exchange two directories in one step, the
    earlier checkpoint is renamed aside and put back if the new one cannot
    be renamed in."""
    monkeypatch.setattr(checkpoint, "_exchange", lambda first, second: False)
    exe = _program()
    exe(torch.ones(4, 4))
    old = {name: value.clone() for name, value in exe.state_dict().items()}
    target = tmp_path / "ckpt"
    write_as_two_processes(old, target)
    exe(torch.ones(4, 4))
    new = {name: value.clone() for name, value in exe.state_dict().items()}
    real_rename = os.rename

    def failing(source: Any, destination: Any) -> None:
        if os.path.basename(os.fspath(source)).startswith(".ckpt.saving"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_rename(source, destination)

    monkeypatch.setattr(os, "rename", failing)
    with pytest.raises(OSError):
        checkpoint.save(exe, target)
    monkeypatch.setattr(os, "rename", real_rename)
    assert _check_whole(target, old, new, "a failed rename") == "old"
    checkpoint.save(exe, target)
    assert _check_whole(target, old, new, "the next save") == "new"


#: A save in a process of its own, stopped once its shard file is written
#: (before ``metadata.json`` and the rename): ``kill`` SIGKILLs itself
#: there; ``wait`` says "staged" and waits for a line on stdin, then
#: finishes; ``aside`` makes the replacement take two renames and
#: SIGKILLs itself between them (the earlier checkpoint renamed aside, the
#: new one not yet in).
_SAVER = """
import os, signal, sys
import torch
import hloalias
from hloalias.runtime import checkpoint

class Counted(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("total", torch.zeros(4, 4))
    def forward(self, x):
        self.total.add_(self.lin(x))
        return self.total * 1

mode, target = sys.argv[1], sys.argv[2]
exe = hloalias.compile(Counted(), (torch.ones(4, 4),))
for _ in range(5):
    exe(torch.ones(4, 4))
real_save, real_rename = torch.save, os.rename

def stopping(value, file, *args, **kwargs):
    real_save(value, file, *args, **kwargs)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "wait":
        print("staged", flush=True)
        sys.stdin.readline()

def renaming(source, destination):
    real_rename(source, destination)
    if os.fspath(source) == os.path.realpath(target):  # the earlier checkpoint went aside
        os.kill(os.getpid(), signal.SIGKILL)

torch.save = stopping
if mode == "aside":
    checkpoint._exchange = lambda first, second: False
    os.rename = renaming
checkpoint.save(exe, target)
print("saved", flush=True)
"""


def _saver(mode: str, target: Path) -> "subprocess.Popen[str]":
    return subprocess.Popen(
        [sys.executable, "-c", _SAVER, mode, str(target)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _killed(process: "subprocess.Popen[str]") -> None:
    """Wait until ``process`` died of SIGKILL, leaving it unreaped (a
    zombie, as a process is until its parent waits for it)."""
    found = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
    assert found is not None and found.si_code == os.CLD_KILLED, (found, process.stderr.read() if process.stderr else "")


def _staged(parent: Path) -> list[str]:
    return sorted(name for name in os.listdir(parent) if ".saving-" in name or ".replaced-" in name)


@pytest.mark.parametrize("next_call", ["save", "load"])
def test_the_next_save_or_load_clears_what_a_killed_save_left(tmp_path: Path, next_call: str) -> None:
    """A save SIGKILLed after writing its shard file leaves its staging
    directory beside the checkpoint (no ``finally`` runs).  The next save
    or load of that checkpoint removes it: its process is dead (here a
    zombie its parent has not reaped yet, then gone).  Before, staging
    directories of killed saves piled up beside the checkpoint."""
    exe = _program()
    exe(torch.ones(4, 4))
    target = tmp_path / "ckpt"
    checkpoint.save(exe, target)
    old = checkpoint.read(target)
    saver = _saver("kill", target)
    _killed(saver)
    left = _staged(tmp_path)
    assert len(left) == 1 and left[0].startswith(".ckpt.saving-"), left
    assert "shards-0.pt" in os.listdir(tmp_path / left[0])
    if next_call == "save":
        exe(torch.ones(4, 4))
        checkpoint.save(exe, target)
        assert _same(checkpoint.read(target), {n: v.clone() for n, v in exe.state_dict().items()})
    else:
        fresh = _program()
        checkpoint.load(fresh, target)
        assert _same(fresh.state_dict(), old)
    assert sorted(os.listdir(tmp_path)) == ["ckpt"], os.listdir(tmp_path)
    saver.wait()
    assert saver.returncode == -signal.SIGKILL


def test_a_live_save_s_staging_directory_is_left_alone(tmp_path: Path) -> None:
    """A save of another live process, stopped after its shard file: this
    process's save and load of the same checkpoint leave its staging
    directory, and it then completes."""
    exe = _program()
    target = tmp_path / "ckpt"
    checkpoint.save(exe, target)
    saver = _saver("wait", target)
    try:
        assert saver.stdout is not None and saver.stdin is not None
        assert saver.stdout.readline().strip() == "staged", saver.stderr.read() if saver.stderr else ""
        staged = _staged(tmp_path)
        assert len(staged) == 1, staged
        checkpoint.save(exe, target)
        checkpoint.load(_program(), target)
        assert _staged(tmp_path) == staged
        assert "shards-0.pt" in os.listdir(tmp_path / staged[0])
        saver.stdin.write("go\n")
        saver.stdin.flush()
        assert saver.stdout.readline().strip() == "saved"
    finally:
        saver.kill()
        saver.wait()
    assert sorted(os.listdir(tmp_path)) == ["ckpt"], os.listdir(tmp_path)
    saved = checkpoint.read(target)
    assert not _same(saved, {n: v.clone() for n, v in exe.state_dict().items()})  # the other process's state


def test_a_checkpoint_a_killed_two_rename_replacement_moved_aside_is_put_back(tmp_path: Path) -> None:
    """Where the replacement takes two renames, a save killed between them
    leaves no checkpoint at its name: the earlier one is in a
    ``.NAME.replaced-*`` directory beside it.  The next load puts it back
    and loads it (before: no readable metadata.json), and nothing is left
    beside it."""
    exe = _program()
    exe(torch.ones(4, 4))
    target = tmp_path / "ckpt"
    checkpoint.save(exe, target)
    old = checkpoint.read(target)
    saver = _saver("aside", target)
    _killed(saver)
    saver.wait()
    assert not target.exists()
    assert any(name.startswith(".ckpt.replaced-") for name in os.listdir(tmp_path)), os.listdir(tmp_path)
    fresh = _program()
    checkpoint.load(fresh, target)
    assert _same(fresh.state_dict(), old)
    checkpoint.save(exe, target)  # and the killed save's staging directory goes with the next save
    assert sorted(os.listdir(tmp_path)) == ["ckpt"], os.listdir(tmp_path)


def test_staging_directories_not_proven_dead_are_left_alone(tmp_path: Path) -> None:
    """What another host (or boot, or pid namespace) staged, a name
    without its host (an earlier format) and a live process's name are
    not this save's to judge: a shared directory's other machines may
    still be writing them."""
    exe = _program()
    target = tmp_path / "ckpt"
    dead_pid = 2**22 + 1  # above Linux's pid_max limit: never a process
    other_host = "0" * 12 if checkpoint._host() != "0" * 12 else "1" * 12
    kept = [
        f".ckpt.saving-{other_host}-{dead_pid}-0-{'a' * 12}",
        f".ckpt.replaced-{other_host}-{dead_pid}-0-{'b' * 12}",
        f".ckpt.saving-{dead_pid}-{'c' * 12}",
        f".ckpt.saving-{checkpoint._owner()}-{'d' * 12}",
        f".other.saving-{checkpoint._host()}-{dead_pid}-0-{'e' * 12}",
    ]
    for name in kept:
        (tmp_path / name).mkdir()
    gone = f".ckpt.saving-{checkpoint._host()}-{dead_pid}-0-{'f' * 12}"
    (tmp_path / gone).mkdir()
    checkpoint.save(exe, target)
    assert sorted(os.listdir(tmp_path)) == sorted([*kept, "ckpt"])
