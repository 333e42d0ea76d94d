"""The forward hooks a program was compiled with, checked at each call.

``torch.export`` runs a module's forward and forward-pre hooks (its own and
the global ones of ``register_module_forward_hook``) while it traces, so a
program holds the hooks registered when it was compiled.  A hook registered
after that (``register_forward_hook`` to scale an output, a pre-hook that
edits an input), or one removed since, would be silently left out or kept:
eager's next call runs the hooks as they are now.

:class:`ModuleHooks` records, at compile time, the hook registrations of the
modules a program runs (the same modules ``runtime/module_modes.py``
finds), holding each module weakly.  Every registration takes a handle id
from torch's one counter (``RemovableHandle.next_id``), so a call on which
the counter has not moved since the last check, and no module that had
hooks at compile time lost one, costs two comparisons; otherwise the
registrations are compared in full (a counter moved by a tensor hook or
another model's hook is then remembered as harmless).  ``changed()`` names
the first module whose hooks differ; ``key()`` is a value equal for equal
registrations (``hloalias.jit`` keys its signatures on it, so a new hook
compiles a program with it instead of refusing)."""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.nn.modules.module as torch_module
from torch.utils.hooks import RemovableHandle

from hloalias.runtime.module_modes import modules_run_by
from hloalias.runtime.state import is_state_sync_hook

#: A module's forward hook registrations: (pre-hook ids, hook ids).
_Registrations = tuple[tuple[int, ...], tuple[int, ...]]


def _counts(hook: Any) -> bool:
    """Whether ``hook`` is one a program holds.  Not counted: the state
    group's own pre-hook (it brings lagging state in and is skipped while
    torch traces), and the hooks transformers installs on a model's layers
    the first time a call asks for hidden states or attentions (they stay,
    and record only while a call that asks for them runs: what they do
    follows the call's inputs and the config, which the key holds)."""
    if is_state_sync_hook(hook):
        return False
    return not (getattr(hook, "__module__", None) or "").startswith(_LIBRARY_HOOKS)


#: Modules whose hooks act through the call's own arguments (above).
_LIBRARY_HOOKS = ("transformers.utils.output_capturing",)


def _registrations(module: torch.nn.Module) -> _Registrations:
    pre_hooks = tuple(key for key, hook in module._forward_pre_hooks.items() if _counts(hook))
    return pre_hooks, tuple(key for key, hook in module._forward_hooks.items() if _counts(hook))


def _global_registrations() -> _Registrations:
    return tuple(torch_module._global_forward_pre_hooks), tuple(torch_module._global_forward_hooks)


class ModuleHooks:
    """The recorded forward hooks of the modules a program runs, held weakly."""

    __slots__ = ("_entries", "_global", "_seen", "_key")

    def __init__(self, entries: tuple[tuple[str, "weakref.ref[torch.nn.Module]", _Registrations], ...]) -> None:
        self._entries = entries
        self._global = _global_registrations()
        self._key: Any = None
        self._seen: tuple[int, tuple[int, int], tuple[tuple[weakref.ref[torch.nn.Module], int, int], ...]] = (0, (0, 0), ())
        self._remember(self._global, tuple(registrations for _, _, registrations in entries))

    def _remember(self, global_now: _Registrations, now: tuple[_Registrations, ...]) -> None:
        """Take the registrations ``now`` (per entry) as the fast check's
        baseline: the counter, the global counts, and the counts of the
        modules that have hooks (a removal moves no counter)."""
        hooked = []
        for (_, ref, _), registrations in zip(self._entries, now):
            module = ref()
            if module is not None and (registrations[0] or registrations[1] or module._forward_pre_hooks or module._forward_hooks):
                hooked.append((ref, len(module._forward_pre_hooks), len(module._forward_hooks)))
        self._seen = (RemovableHandle.next_id, (len(global_now[0]), len(global_now[1])), tuple(hooked))

    @classmethod
    def of(cls, *targets: Any) -> "ModuleHooks | None":
        """The hooks of the modules ``targets`` run now (None: no module)."""
        entries: list[tuple[str, weakref.ref[torch.nn.Module], _Registrations]] = []
        seen: set[int] = set()
        for target in targets:
            for root, _ in modules_run_by(target):
                for name, module in root.named_modules():
                    if id(module) in seen:
                        continue
                    seen.add(id(module))
                    label = f"{type(module).__name__} '{name}'" if name else type(module).__name__
                    entries.append((label, weakref.ref(module), _registrations(module)))
        return cls(tuple(entries)) if entries else None

    def _unmoved(self) -> bool:
        """Whether nothing can have changed since the baseline was taken."""
        counter, global_counts, hooked = self._seen
        if RemovableHandle.next_id != counter or global_counts != (
            len(torch_module._global_forward_pre_hooks), len(torch_module._global_forward_hooks)
        ):
            return False
        for ref, pre_hooks, hooks in hooked:
            module = ref()
            if module is not None and (len(module._forward_pre_hooks), len(module._forward_hooks)) != (pre_hooks, hooks):
                return False
        return True

    def _now(self) -> tuple[_Registrations, ...]:
        now = []
        for _, ref, registrations in self._entries:
            module = ref()
            now.append(registrations if module is None else _registrations(module))
        return tuple(now)

    def changed(self) -> str | None:
        """A description of the first difference from the recorded hooks, or None."""
        if self._unmoved():
            return None
        global_now, now = _global_registrations(), self._now()
        if global_now != self._global:
            return (
                "a global module forward hook (torch.nn.modules.module.register_module_forward_hook) "
                "was registered or removed after compiling"
            )
        for (label, _, registrations), registrations_now in zip(self._entries, now):
            if registrations_now != registrations:
                return f"a forward hook of {label} was registered or removed after compiling"
        self._remember(global_now, now)  # the counter moved for something else
        return None

    def key(self) -> Any:
        """A value equal for equal hook registrations (a dead module counts as unchanged)."""
        if self._key is None or not self._unmoved():
            global_now, now = _global_registrations(), self._now()
            self._key = (global_now, now)
            self._remember(global_now, now)
        return self._key
