"""The train/eval modes a program was compiled under, checked at each call.

``torch.export`` bakes every ``self.training`` it reads into the program:
dropout, BatchNorm's batch statistics and their running-average updates,
and every model that branches on the flag (Hugging Face attention passes
``dropout=0.0 if not self.training else p``).  An executable compiled with
the model in train mode and called after ``model.eval()`` (or the other way
round) would run the other mode's program: a silently wrong value.

:class:`ModuleModes` records, at compile time, the modules whose flag the
program may have read (the compiled module and every submodule whose
class's own code reads ``training``, a compiled function's module when the
function's code reads it) and their flags, holding each
module weakly (an executable never keeps a model alive).  ``changed()``
names the first module whose flag differs now; ``key()`` is the tuple of
flags (``hloalias.jit`` keys its signatures on it, so a mode switch
compiles the other mode's program instead of refusing).

Which modules a plain function reads is found from its closure and the
globals its code names (``inspect.getclosurevars``); a module it reaches
another way is not checked."""

from __future__ import annotations

import inspect
import types
import weakref
from typing import Any

import torch

_MODULE_CODE = frozenset(
    id(value) for value in vars(torch.nn.Module).values() if isinstance(value, types.FunctionType)
)


def _code_reads_training(code: types.CodeType) -> bool:
    if "training" in code.co_names:
        return True
    return any(isinstance(const, types.CodeType) and _code_reads_training(const) for const in code.co_consts)


_READS_TRAINING: dict[type, bool] = {}


def _class_reads_training(cls: type) -> bool:
    found = _READS_TRAINING.get(cls)
    if found is None:
        found = _READS_TRAINING[cls] = _class_code_reads_training(cls)
    return found


def _class_code_reads_training(cls: type) -> bool:
    """Whether code defined by ``cls`` or a base below ``nn.Module`` reads
    an attribute named ``training`` (``self.training``, ``F.dropout(...,
    training=...)`` passes it as a keyword, which is no attribute read)."""
    for klass in cls.__mro__:
        if klass is torch.nn.Module or klass is object:
            continue
        for value in vars(klass).values():
            function = getattr(value, "__func__", value)
            if isinstance(value, property):
                function = value.fget
            code = getattr(function, "__code__", None)
            if isinstance(code, types.CodeType) and id(function) not in _MODULE_CODE and _code_reads_training(code):
                return True
    return False


def modules_run_by(f: Any) -> list[tuple[torch.nn.Module, bool]]:
    """The modules ``f`` runs: itself, the module of a bound method, or the
    modules a function closes over or names as globals; each with whether
    ``f``'s own code reads ``training`` (``model.training`` in a function)."""
    if isinstance(f, torch.nn.Module):
        return [(f, False)]
    function = getattr(f, "__func__", f)
    reads = isinstance(function, types.FunctionType) and _code_reads_training(function.__code__)
    owner = getattr(f, "__self__", None)
    if isinstance(owner, torch.nn.Module):
        return [(owner, reads)]
    if not isinstance(function, types.FunctionType):
        return []
    try:
        variables = inspect.getclosurevars(function)
    except (TypeError, ValueError):
        return []
    found = [*variables.nonlocals.values(), *variables.globals.values()]
    return [(value, reads) for value in found if isinstance(value, torch.nn.Module)]


class ModuleModes:
    """The recorded flags of the modules a program may read, held weakly."""

    __slots__ = ("_entries",)

    def __init__(self, entries: tuple[tuple[str, weakref.ref[torch.nn.Module], bool], ...]) -> None:
        self._entries = entries

    @classmethod
    def of(cls, *targets: Any) -> "ModuleModes | None":
        """The modes of the modules ``targets`` run now (None: no module)."""
        entries: list[tuple[str, weakref.ref[torch.nn.Module], bool]] = []
        seen: set[int] = set()
        for target in targets:
            for root, read_by_caller in modules_run_by(target):
                for name, module in root.named_modules(remove_duplicate=False):
                    read = _class_reads_training(type(module)) or (module is root and read_by_caller)
                    if id(module) in seen or not read:
                        continue
                    seen.add(id(module))
                    label = f"{type(module).__name__} '{name}'" if name else type(module).__name__
                    entries.append((label, weakref.ref(module), module.training))
        return cls(tuple(entries)) if entries else None

    def changed(self) -> str | None:
        """A description of the first module whose flag is not the recorded
        one, or None."""
        for label, ref, training in self._entries:
            module = ref()
            if module is not None and bool(module.training) != training:
                was, now = ("train", "eval") if training else ("eval", "train")
                return f"{label} was in {was} mode when compiled and is in {now} mode now"
        return None

    def key(self) -> tuple[bool, ...]:
        """The flags as they are now (a dead module counts as unchanged)."""
        flags = []
        for _, ref, training in self._entries:
            module = ref()
            flags.append(training if module is None else bool(module.training))
        return tuple(flags)
