"""The train/eval modes and the plain settings a program was compiled
under, checked at each call.

``torch.export`` bakes every ``self.training`` it reads into the program:
dropout, BatchNorm's batch statistics and their running-average updates,
and every model that branches on the flag (Hugging Face attention passes
``dropout=0.0 if not self.training else p``).  It bakes every other plain
attribute a forward reads the same way: ``self.scale``, ``self.use_relu``,
``self.eps``, a ``self.temperature`` a user sets between calls.  An
executable compiled with one value and called after the module's flag or
attribute changed would run the old value's program: a silently wrong
value.

:class:`ModuleModes` records, at compile time, for every module a program
runs, the attributes its class's own code names (and, for the module a
compiled function closes over, the ones that function's code names) whose
values are plain (``bool``, ``int``, ``float``, ``str``, ``None``, a dtype
or device, tuples of these), ``training`` among them; each module is held
weakly (an executable never keeps a model alive).  A name is read from the
code (``co_names``), not from the trace, so a name the code uses for
something else (a local method's attribute) is checked too: a change there
refuses where eager would not differ, never the other way round.
``changed()`` names the first module and attribute that differ now;
``key()`` is the tuple of values (``hloalias.jit`` keys its signatures on
it, so a mode switch or a new value compiles the other program instead of
refusing).

Which modules a plain function reads is found from its closure and the
globals its code names (``inspect.getclosurevars``); a module it reaches
another way is not checked.  Of a non-plain attribute only a ``config``
object that the code names is followed (its plain attributes: a
transformers model's ``output_hidden_states``, ``use_cache``), and of a
Hugging Face module only ``training`` is checked (its other attributes
are copies of its ``config``, set at construction).  Of a transformers
config the checkpoint bookkeeping that ``save_pretrained`` and
``from_pretrained`` write (``architectures``, ``dtype``, ``_name_or_path``:
``_CONFIG_METADATA``) is not checked, since no transformers forward
computes with it; code outside transformers that names ``config`` and such
a field keeps it checked."""

from __future__ import annotations

import functools
import inspect
import operator
import types
from collections.abc import Callable
import weakref
from typing import Any

import torch

from hloalias.frontend.closure_tensors import code_names, filled

_MODULE_CODE = frozenset(
    id(value) for value in vars(torch.nn.Module).values() if isinstance(value, types.FunctionType)
)


_CLASS_NAMES: dict[type, frozenset[str]] = {}


def _class_names(cls: type) -> frozenset[str]:
    """The attribute names ``cls``'s ``forward`` may read: the names its
    code uses, and those of the methods and properties of ``cls`` it names
    (``self._attend(...)``), transitively; plus ``training`` where any code
    defined by ``cls`` or a base below ``nn.Module`` names it (a flag is
    read through helpers a name search does not follow: ``F.dropout(...,
    training=...)`` passes it as a keyword, which is no name, but a helper
    taking ``self`` reads it)."""
    found = _CLASS_NAMES.get(cls)
    if found is not None:
        return found
    members: dict[str, types.CodeType] = {}
    any_training = False
    for klass in reversed(cls.__mro__):
        if klass is torch.nn.Module or klass is object:
            continue
        for name, value in vars(klass).items():
            function = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
            code = getattr(function, "__code__", None)
            if isinstance(code, types.CodeType) and id(function) not in _MODULE_CODE:
                members[name] = code  # a subclass's definition replaces its base's
                any_training = any_training or "training" in code_names(code)
    names: set[str] = set()
    pending = ["forward"]
    while pending:
        code = members.pop(pending.pop(), None)
        if code is None:
            continue
        used = code_names(code)
        names |= used
        pending.extend(name for name in used if name in members)
    if any_training:
        names.add("training")
    found = _CLASS_NAMES[cls] = frozenset(names)
    return found


#: Model libraries whose modules take their settings from a ``config``
#: object at construction (``self.head_dim``, ``self.scaling``): checking
#: every such attribute at every call would cost more than the change it
#: guards against, which no library documents; their ``training`` is checked.
_SETTINGS_IN_CONFIG = frozenset({"transformers"})

#: Fields of a transformers config that record where the weights came from
#: and how to load them again, not how to compute: ``save_pretrained`` sets
#: ``architectures`` (to ``[class name]``) and ``dtype`` (to the weights'
#: dtype name, ``"float32"``) and deletes ``transformers_weights``;
#: ``from_pretrained`` sets ``_name_or_path``.  A user who checkpoints
#: mid-training changes them between two calls.  transformers' own forward
#: code does not read them (its modeling code reads ``architectures``,
#: ``_name_or_path`` and ``transformers_version`` only when loading; it reads
#: ``config.dtype`` in a forward only as the cast target of a quantized
#: model's flash-attention kernel, ``integrations/flash_attention.py``, a
#: CUDA kernel no program here runs), so they are not checked, unless code
#: outside transformers that the program runs (a user's module class, the
#: compiled function) names one: then it is, as any other setting.
_CONFIG_METADATA = frozenset({"architectures", "dtype", "_name_or_path", "transformers_version",
                              "transformers_weights", "_commit_hash"})

def _library_config(cls: type) -> bool:
    """Whether ``cls`` is (or derives from) a config class of a library of
    ``_SETTINGS_IN_CONFIG``: a user's config subclass gets its fields set
    by the same ``save_pretrained``."""
    return any(klass.__module__.split(".")[0] in _SETTINGS_IN_CONFIG for klass in cls.__mro__)


class _Identity:
    """A tensor or module a function reads from its enclosing scope, equal
    only to a token of the same object (a tensor's ``==`` is elementwise).
    It holds the object, so that its id is not reused while recorded."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Identity) and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)

    def __repr__(self) -> str:
        value = self.value
        if isinstance(value, torch.Tensor):
            return f"the tensor {str(value.dtype).removeprefix('torch.')}{list(value.shape)} at {id(value):#x}"
        return f"the {type(value).__name__} at {id(value):#x}"


class _FunctionScope:
    """The names a compiled function reads from its closure and globals,
    read as a mapping (``__dict__``, as a module's attributes are): a plain
    value as itself, a tensor or module as an :class:`_Identity`.
    Rebinding one (``w = torch.zeros(4)``, ``temperature = 1.0``) changes
    what eager computes, and the program baked the old one in."""

    __slots__ = ("_function", "_cells", "_globals", "__weakref__")

    def __init__(self, function: types.FunctionType) -> None:
        self._function = function
        code = function.__code__
        namespace = function.__globals__
        # Only the names holding a value recorded (plain, tensor, module):
        # the mapping is built at every call.
        self._globals = tuple(
            name for name in sorted(code_names(code) & set(namespace)) if _is_plain(_token(namespace[name]))
        )
        self._cells = {
            name: cell for name, cell in zip(code.co_freevars, function.__closure__ or ())
            if filled(cell) and _is_plain(_token(cell.cell_contents))
        }

    @property
    def __dict__(self) -> dict[str, Any]:  # type: ignore[override]
        found: dict[str, Any] = {}
        namespace = self._function.__globals__
        for name in self._globals:
            if name in namespace:
                found[name] = _token(namespace[name])
        for name, cell in self._cells.items():
            try:
                found[name] = _token(cell.cell_contents)
            except ValueError:  # an empty cell: a name bound later
                pass
        return found


def _token(value: Any) -> Any:
    return _Identity(value) if isinstance(value, (torch.Tensor, torch.nn.Module)) else value


def _plain_function(target: Any) -> types.FunctionType | None:
    """The Python function ``target`` runs, when it is not a module's own
    method (a module's state is followed as such)."""
    while isinstance(target, functools.partial):
        target = target.func
    if isinstance(target, torch.nn.Module) or isinstance(getattr(target, "__self__", None), torch.nn.Module):
        return None
    function = getattr(target, "__func__", target)
    return function if isinstance(function, types.FunctionType) else None


_PLAIN = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device, torch.memory_format, _Identity)


def _is_plain(value: Any, depth: int = 0) -> bool:
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, (tuple, frozenset)) and depth < 3:
        return all(_is_plain(item, depth + 1) for item in value)
    return False


def _same(recorded: Any, now: Any) -> bool:
    # Identity first: a NaN equals itself only that way.
    return recorded is now or (type(recorded) is type(now) and recorded == now)


def modules_run_by(f: Any) -> list[tuple[torch.nn.Module, frozenset[str]]]:
    """The modules ``f`` runs: itself, the module of a bound method, or the
    modules a function closes over or names as globals; each with the
    names ``f``'s own code uses (``model.training`` in a function)."""
    if isinstance(f, torch.nn.Module):
        return [(f, frozenset())]
    function = getattr(f, "__func__", f)
    names = code_names(function.__code__) if isinstance(function, types.FunctionType) else frozenset()
    owner = getattr(f, "__self__", None)
    if isinstance(owner, torch.nn.Module):
        return [(owner, names)]
    if not isinstance(function, types.FunctionType):
        return []
    try:
        variables = inspect.getclosurevars(function)
    except (TypeError, ValueError):
        return []
    found = [*variables.nonlocals.values(), *variables.globals.values()]
    return [(value, names) for value in found if isinstance(value, torch.nn.Module)]


#: One module's (or its config's) recorded settings: the object (weakly), a getter of the
#: attribute values from its ``__dict__`` (a tuple, or the value for one name), their
#: values when compiled, its label and the attribute names.
_Entry = tuple["weakref.ref[Any]", Callable[[dict[str, Any]], Any], Any, str, tuple[str, ...]]


def _record(entries: list["_Entry"], owner: Any, names: frozenset[str], label: str) -> None:
    """Append ``owner``'s entry: its plain attributes among ``names``."""
    attributes = owner.__dict__
    read = tuple(sorted(n for n in names if n in attributes and _is_plain(attributes[n])))
    if read:
        # One name: itemgetter gives the value itself, not a 1-tuple.
        getter = operator.itemgetter(*read)
        entries.append((weakref.ref(owner), getter, getter(attributes), label, read))


class ModuleModes:
    """The recorded modes and plain settings of the modules a program runs, held weakly."""

    __slots__ = ("_entries", "_scopes")

    def __init__(self, entries: tuple[_Entry, ...], scopes: tuple[_FunctionScope, ...] = ()) -> None:
        self._entries = entries
        #: The function scopes the entries hold weakly.
        self._scopes = scopes

    @classmethod
    def of(cls, *targets: Any) -> "ModuleModes | None":
        """The settings of the modules ``targets`` run now (None: none)."""
        entries: list[_Entry] = []
        scopes: list[_FunctionScope] = []
        seen: set[int] = set()
        # The names code outside the config libraries uses (a user's module
        # class, the compiled function): metadata it names is checked.
        outside_names: set[str] = set()
        configs: list[tuple[Any, str]] = []
        for target in targets:
            function = _plain_function(target)
            if function is not None:
                scope = _FunctionScope(function)
                scopes.append(scope)
                _record(entries, scope, frozenset(scope.__dict__), f"{function.__qualname__}'s enclosing scope")
            for root, caller_names in modules_run_by(target):
                outside_names |= caller_names
                for name, module in root.named_modules(remove_duplicate=False):
                    if id(module) in seen:
                        continue
                    seen.add(id(module))
                    names = class_names = _class_names(type(module))
                    if type(module).__module__.split(".")[0] in _SETTINGS_IN_CONFIG:
                        names = names & {"training"}
                    else:
                        outside_names |= class_names
                    if module is root:
                        names = names | caller_names
                    label = f"{type(module).__name__} '{name}'" if name else type(module).__name__
                    _record(entries, module, names, label)
                    config = module.__dict__.get("config")
                    if "config" in class_names and config is not None and not _is_plain(config) and id(config) not in seen:
                        # A model's settings object (a transformers config):
                        # forward reads its flags (output_hidden_states,
                        # use_cache) through it; every plain one counts.
                        seen.add(id(config))
                        configs.append((config, f"{type(config).__name__} (config of {label})"))
        for config, label in configs:
            settings = getattr(config, "__dict__", None)
            if isinstance(settings, dict):
                names = frozenset(settings)
                if _library_config(type(config)):
                    # Outside code reaches a config as ``.config`` (the
                    # only one followed here) and then names the field.
                    names -= _CONFIG_METADATA - (outside_names if "config" in outside_names else set())
                _record(entries, config, names, label)
        return cls(tuple(entries), tuple(scopes)) if entries else None

    def without_written(self, before: "ModuleModes | None") -> "ModuleModes | None":
        """These settings (taken after a trace) less the attributes whose
        value differs from ``before`` (taken before it, from the same
        targets): a forward that sets an attribute it reads (a call
        counter) set it while torch traced, and would otherwise refuse the
        calls after the next trace."""
        recorded = {id(entry[0]()): entry for entry in (before._entries if before is not None else ())}
        entries: list[_Entry] = []
        for ref, getter, values, label, names in self._entries:
            earlier = recorded.get(id(ref()))
            if earlier is None or earlier[2] is values or earlier[2] == values:
                entries.append((ref, getter, values, label, names))
                continue
            pairs = list(zip(earlier[4], earlier[2] if len(earlier[4]) > 1 else (earlier[2],)))
            was = dict(pairs)
            kept = tuple(
                name for name, value in zip(names, values if len(names) > 1 else (values,))
                if name in was and _same(was[name], value)
            )
            if kept:
                getter = operator.itemgetter(*kept)
                module = ref()
                assert module is not None
                entries.append((ref, getter, getter(module.__dict__), label, kept))
        return ModuleModes(tuple(entries), self._scopes) if entries else None

    def changed(self) -> str | None:
        """A description of the first module whose flag or setting is not
        the recorded one, or None."""
        for ref, getter, values, label, names in self._entries:
            module = ref()
            if module is None:
                continue
            try:
                now = getter(module.__dict__)
                # Identity first (a NaN equals itself only that way): a
                # tuple compares its elements so, a single value here.
                if now is values or now == values:
                    continue
            except KeyError:  # an attribute deleted since
                pass
            return self._describe(module, values, label, names)
        return None

    @staticmethod
    def _describe(module: Any, values: Any, label: str, names: tuple[str, ...]) -> str:
        attributes = module.__dict__
        for name, value in zip(names, values if len(names) > 1 else (values,)):
            now = attributes.get(name, _MISSING)
            if _same(value, now):
                continue
            if name == "training" and isinstance(now, bool):
                was, is_now = ("train", "eval") if value else ("eval", "train")
                return f"{label} was in {was} mode when compiled and is in {is_now} mode now"
            shown = "deleted" if now is _MISSING else f"{now!r}"
            kind = "name" if isinstance(module, _FunctionScope) else "attribute"
            return f"{kind} '{name}' of {label} was {value!r} when compiled and is {shown} now"
        return f"the attributes {list(names)} of {label} changed since compiling"

    def key(self) -> tuple[Any, ...]:
        """The values as they are now (a dead module counts as unchanged)."""
        now: list[Any] = []
        for ref, getter, values, _, _ in self._entries:
            module = ref()
            try:
                now.append(values if module is None else getter(module.__dict__))
            except KeyError:
                now.append(_MISSING)
        return tuple(now)


class _Missing:
    def __repr__(self) -> str:
        return "<deleted>"


_MISSING: Any = _Missing()
