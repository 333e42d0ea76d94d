"""What every hloalias pass shares: typed options parsed from MLIR's textual
option syntax, a Python entry point, and an adapter that adds the pass to a
torch-mlir ``PassManager``."""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import re
import typing
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, Generic, Protocol, TypeVar, Union

from torch_mlir import ir, passmanager
from torch_mlir.dialects import func

from hloalias.attributes import is_index
from hloalias.contract import verify
from hloalias.errors import IRError, PassError

ReportT = TypeVar("ReportT", covariant=True)


class _HasTorchMlirModule(Protocol):
    """An hloalias ``Program`` (or anything holding a torch-mlir module)."""

    @property
    def torch_mlir_module(self) -> ir.Module: ...


ModuleLike = Union[ir.Module, ir.Operation, "_ModuleView", _HasTorchMlirModule]
"""What a pass's ``apply`` takes: a module, a module operation or a Program."""


@dataclasses.dataclass(frozen=True)
class ModulePass(ABC, Generic[ReportT]):
    """A pass over a whole ``builtin.module`` whose runs return ``ReportT``.

    Subclasses are frozen dataclasses: each field is an option, spelt in
    kebab case in pipelines (``dead_results`` is ``dead-results``), documented
    by ``field(metadata={"help": ...})``.  ``apply`` validates everything it
    reads before it changes anything, so a failing pass leaves the module as
    it was.  In a pipeline, the IR contract (:func:`hloalias.contract.verify`)
    is checked before the first hloalias pass of each run of them and after
    every hloalias pass (the check after one is the check before the next);
    a run of the pipeline is a :func:`hloalias.contract.verification_scope`,
    so a check after a pass that left ``@main``'s signature alone costs a
    lookup.  A module broken by a pass is an error naming the pass."""

    name: ClassVar[str]

    @abstractmethod
    def apply(self, module: ModuleLike) -> ReportT:
        """Run the pass on ``module`` in place and return its report.
        Raises :class:`PassError` (naming the culprit) on bad input."""

    # -- options ---------------------------------------------------------
    @classmethod
    def option_help(cls) -> dict[str, str]:
        """``{kebab option name: help}`` for ``--list-passes``."""
        return {
            f.name.replace("_", "-"): f.metadata.get("help", "")
            for f in dataclasses.fields(cls)
            if f.init
        }

    @classmethod
    def from_options(cls, text: str) -> ModulePass[Any]:
        """Build the pass from MLIR option text: ``a=1 b=x,y flag``."""
        fields = _option_fields(cls)
        values: dict[str, Any] = {}
        for key, raw in _split_options(text):
            if key not in fields:
                known = ", ".join(sorted(fields)) or "none"
                raise PassError(f"{cls.name}: unknown option '{key}' (options: {known})")
            field = fields[key]
            values[field.name] = _convert(cls.name, key, raw, _option_hints(cls)[field.name])
        return cls(**values)

    def option_text(self) -> str:
        """This pass as it would be written in a pipeline."""
        parts: list[str] = []
        for field in dataclasses.fields(self):
            if not field.init:
                continue
            value = getattr(self, field.name)
            if value == field.default:
                continue
            if isinstance(value, bool):
                text = "true" if value else "false"
            elif isinstance(value, tuple):
                text = ",".join(str(v) for v in value)
            else:
                text = str(value)
            parts.append(f"{field.name.replace('_', '-')}={text}")
        return f"{self.name}{{{' '.join(parts)}}}" if parts else self.name

    # -- pass manager ----------------------------------------------------
    def add_to(
        self, pm: passmanager.PassManager, reports: list[Any] | None = None, *, verify_on_entry: bool = True
    ) -> None:
        """Append this pass to a torch-mlir ``PassManager`` anchored on
        ``builtin.module``.  Each run's report is appended to ``reports``.
        An :class:`IRError` (a rejected input, or a module that breaks the
        IR contract before or after the pass) becomes an MLIR error
        diagnostic at the offending location and fails the pipeline.
        ``verify_on_entry=False`` skips the check before the pass: only for
        a pass placed right after another hloalias pass, whose check on
        exit saw the same module."""

        def run(op: ir.Operation, pass_: Any) -> None:
            module = _ModuleView(op)
            applied = False
            try:
                if verify_on_entry:
                    _verify_contract(module)
                applied = True
                # The checks around the pass are this adapter's: the pass's
                # own verify_contract() calls on entry and exit would repeat them.
                token = _ADAPTER_CHECKS.set(True)
                try:
                    report = self.apply(module)
                finally:
                    _ADAPTER_CHECKS.reset(token)
                _verify_contract(module)
            except IRError as error:
                message = str(error)
                # The module was whole before the pass, and a pass that
                # rejects its input leaves it as it was: broken now, the
                # pass broke it (caught here or by the pass's own check).
                if applied and _contract_error(module) is not None:
                    message = f"{self.name} broke the IR contract: {message}"
                _main_location(op).emit_error(message)
                pass_.signal_pass_failure()
                return
            if reports is not None:
                reports.append(report)

        pm.add(run, name=self.name, argument=self.name)


@functools.cache
def _option_fields(cls: type) -> dict[str, dataclasses.Field[Any]]:
    """A pass class's options by kebab name (read once per class)."""
    return {f.name.replace("_", "-"): f for f in dataclasses.fields(cls) if f.init}


@functools.cache
def _option_hints(cls: type) -> dict[str, Any]:
    """A pass class's type hints, read once per class and only when an
    option is given: ``get_type_hints`` evaluates every annotation of the
    class and its bases (~1-2 ms for the default pipeline's passes, none of
    which takes an option there)."""
    return typing.get_type_hints(cls)


#: True while a pipeline's adapter (:meth:`ModulePass.add_to`) runs a
#: pass's ``apply``: the adapter checks the contract before the pass (or the
#: pass before it did, on its way out, on the same module) and after it, so
#: the ``verify_contract(module)`` a pass calls on entry and on exit checks
#: the same module again.  Those calls return at once while it is set; a
#: ``full`` check and a pass's own :func:`hloalias.contract.verify` (which
#: returns the records it reads) still run.
_ADAPTER_CHECKS: contextvars.ContextVar[bool] = contextvars.ContextVar("hloalias_adapter_checks", default=False)


def verify_contract(module: ModuleLike, *, full: bool = False) -> None:
    """:func:`hloalias.contract.verify` on the module's ``@main``, if it has
    one (a pass such as fold-transpose-into-dot-general needs none);
    ``full``: read the signature even where a verification scope checked it.
    Inside a pipeline's adapter, a check that is not ``full`` is the
    adapter's own (see :data:`_ADAPTER_CHECKS`) and returns at once."""
    if not full and _ADAPTER_CHECKS.get():
        return
    _verify_contract(module, full=full)


def _verify_contract(module: ModuleLike, *, full: bool = False) -> None:
    """:func:`verify_contract`, whoever asks (the adapter's checks)."""
    view = as_module_like(module)
    with view.context:
        for op in view.body.operations:
            if op.operation.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == "main":
                verify(op if isinstance(op, func.FuncOp) else func.FuncOp(op.operation), full=full)
                return


def _contract_error(module: ModuleLike) -> IRError | None:
    """What a full check of the contract (no :func:`verification_scope`
    record) says of ``module``: None when it holds."""
    try:
        _verify_contract(module, full=True)
    except IRError as error:
        return error
    return None


def _main_location(module_op: ir.Operation) -> ir.Location:
    """Where a pass error points: ``@main`` when the module has one."""
    for op in module_op.regions[0].blocks[0].operations:
        if op.operation.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == "main":
            return op.location
    return module_op.location


class _ModuleView:
    """Gives an ``ir.Operation`` (what a PassManager hands a Python pass)
    the ``body``/``operation`` surface of ``ir.Module`` the passes use."""

    def __init__(self, op: ir.Operation) -> None:
        self.operation = op.operation
        self.body = op.regions[0].blocks[0]
        self.context = op.context


def as_module_like(module: ModuleLike) -> Any:
    """Accept an ``ir.Module``, a module ``ir.Operation`` or an hloalias
    ``Program``; return what passes operate on."""
    if hasattr(module, "torch_mlir_module"):
        return module.torch_mlir_module
    if isinstance(module, ir.Module):
        return module
    operation = getattr(module, "operation", None)
    if operation is not None and operation.name == "builtin.module":
        return _ModuleView(operation)
    raise TypeError(f"expected an MLIR module, got {type(module).__name__}")


_OPTION_RE = re.compile(r"\s*([A-Za-z0-9_-]+)(?:=(\S*))?")


def _split_options(text: str) -> list[tuple[str, str | None]]:
    pairs: list[tuple[str, str | None]] = []
    position = 0
    text = text.strip()
    while position < len(text):
        match = _OPTION_RE.match(text, position)
        if not match or match.end() == position:
            raise PassError(f"cannot parse pass options '{text}'")
        pairs.append((match[1], match[2]))
        position = match.end()
    return pairs


def _convert(pass_name: str, key: str, raw: str | None, hint: Any) -> Any:
    def fail(expected: str) -> PassError:
        return PassError(f"{pass_name}: option '{key}' expects {expected}, got '{raw}'")

    if hint is bool:
        if raw is None or raw in ("true", "1"):
            return True
        if raw in ("false", "0"):
            return False
        raise fail("true or false")
    if raw is None:
        raise PassError(f"{pass_name}: option '{key}' needs a value ('{key}=...')")
    origin = typing.get_origin(hint)
    if origin is tuple:
        (element, _ellipsis) = typing.get_args(hint)
        items = [item for item in raw.split(",") if item != ""]
        if element is int:
            if not all(_is_integer(item) for item in items):
                raise fail("a comma-separated list of integers")
            return tuple(int(item) for item in items)
        return tuple(items)
    if hint is int:
        if not _is_integer(raw):
            raise fail("an integer")
        return int(raw)
    if hint is str:
        return raw
    raise TypeError(f"unsupported option type {hint!r}")


def _is_integer(text: str) -> bool:
    """An optionally negative decimal integer in ASCII digits only."""
    return is_index(text[1:] if text.startswith("-") else text)


PassFactory = Callable[[str], ModulePass[Any]]
