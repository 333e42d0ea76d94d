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
