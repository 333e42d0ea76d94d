"""``permute-conv-kernel-state``: module state read only as a convolution
kernel is stored in the layout XLA:CPU's convolution reads.

torch keeps a ``Conv2d`` weight as OIHW; XLA:CPU's convolution wants its
kernel as HWIO (spatial dimensions, then input and output features) and
copies the weight into that layout in temporary memory on every call (HF
ResNet: temp about the size of all conv weights).  Entry layouts do not help
on XLA:CPU (``mhlo.layout_mode = "auto"`` keeps the default, an explicit one
is copied back; bench/RESULTS-temp.md).  Module state lives on the device and
is the runtime's, so it can be stored in the wanted layout once: this pass
gives the state argument the permuted shape (``tensor.permute(P)``), points
each convolution's kernel dimension numbers at the permuted dimensions (the
same convolution, exact) and records P as ``hloalias.stored_permutation``.
The runtime uploads that state permuted, and ``state_dict()`` /
``load_state_dict`` apply the inverse, so users only ever see torch's layout.

Applies to an argument of ``@main`` that is module state (``parameter``,
``buffer`` or ``constant``) whose every use is the kernel (operand 1) of a
``stablehlo.convolution`` with ``batch_group_count = 1`` (any rank, any
``feature_group_count``: measured to remove the copy for 1-d, 2-d, 3-d,
grouped and depthwise convolutions), where all those convolutions want the
same permutation ``(kernel spatial..., input feature, output feature)`` and
it is not the identity.

Never applies to: user inputs (their layout is the caller's); state XLA may
overwrite (``tf.aliasing_output``, ``jax.buffer_donor``) or that a result
mutates (training updates, buffers written in place: the new value would
have to be written back in the permuted layout); state that is the base of
a rebuilt view (``hloalias.removed_results`` ``arg:I``: a torch view needs
torch's layout); sharded state (``mhlo.sharding`` is in torch's
dimensions); state with any other use (returned, added to, sliced); a
kernel of a ``batch_group_count > 1`` convolution (not measured).

``layouts`` fixes the layout of named state whose device buffer exists
already (the runtime passes the layouts of the module's shared state, so a
later program reads the buffer as an earlier one stored it): ``NAME:torch``
keeps torch's layout, ``NAME:2.3.1.0`` stores ``permute(2, 3, 1, 0)`` for any
read-only use (a ``stablehlo.transpose`` back feeds uses that are not
convolution kernels).  A named argument that must stay in torch's layout
(written, donated, a view's base, sharded) is left so and reported; names
the module does not have are ignored."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo

from hloalias import attributes as A
from hloalias.contract import ArgRecord, Signature, inverse_permutation, verify
from hloalias.errors import PassError
from hloalias.mlir import find_main
from hloalias.passes.base import ModuleLike, ModulePass, as_module_like

TORCH_LAYOUT = "torch"


@dataclasses.dataclass(frozen=True)
class PermutedState:
    """One state argument now stored permuted."""

    arg_index: int
    name: str
    permutation: tuple[int, ...]
    kernel_uses: int
    other_uses: int


@dataclasses.dataclass(frozen=True)
class PermuteReport:
    """What was permuted, and which fixed layouts could not be used."""

    permuted: tuple[PermutedState, ...]
    kept_in_torch_layout: tuple[tuple[str, str], ...] = ()

    def to_text(self) -> str:
        """The report as people read it."""
        lines = [f"permute-conv-kernel-state: {len(self.permuted)} state arguments stored permuted"]
        for entry in self.permuted:
            uses = f"{entry.kernel_uses} convolution kernel use(s)"
            if entry.other_uses:
                uses += f", {entry.other_uses} other use(s) through a transpose"
            lines.append(f"  '{entry.name}' (argument {entry.arg_index}): permute{entry.permutation}; {uses}")
        for name, reason in self.kept_in_torch_layout:
            lines.append(f"  '{name}' kept in torch's layout despite its fixed layout: {reason}")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class PermuteConvKernelState(ModulePass[PermuteReport]):
    """Store read-only state used only as convolution kernels in the kernel's layout."""

    name: ClassVar[str] = "permute-conv-kernel-state"

    layouts: tuple[str, ...] = dataclasses.field(
        default=(),
        metadata={"help": "fixed layouts of existing state: NAME:torch or NAME:P0.P1... (a permutation)"},
    )

    def apply(self, module: ModuleLike) -> PermuteReport:
        """Permute every eligible state argument of ``@main`` in place.
        Everything is checked before anything changes: a malformed
        ``layouts`` entry, or one that contradicts a permutation the module
        already records, is a :class:`PassError`."""
        module = as_module_like(module)
        fixed = self._fixed_layouts()
        with module.context, ir.Location.unknown():
            main = find_main(module)
            contract = verify(main)
            block = main.regions[0].blocks[0]
            plans: list[tuple[int, tuple[int, ...]]] = []
            kept: list[tuple[str, str]] = []
            for index, arg in enumerate(contract.args):
                name = arg.display_name(index)
                value = block.arguments[index]
                rank = ir.RankedTensorType(value.type).rank
                wanted = fixed.get(name, ())
                if wanted is not None and wanted != () and sorted(wanted) != list(range(rank)):
                    raise PassError(
                        f"{self.name}: layout {list(wanted)} of '{name}' is not a permutation of the "
                        f"dimensions of {value.type}"
                    )
                if arg.stored_permutation is not None:
                    if name in fixed and wanted != arg.stored_permutation:
                        shown = TORCH_LAYOUT if wanted is None else list(wanted)
                        raise PassError(
                            f"{self.name}: '{name}' is already stored as permute{arg.stored_permutation}; "
                            f"cannot store it as {shown}"
                        )
                    continue
                blocker = _blocker(contract, index, arg)
                if name in fixed:
                    if wanted is None or wanted == tuple(range(rank)):
                        continue
                    if blocker is not None:
                        kept.append((name, blocker))
                        continue
                    assert isinstance(wanted, tuple)
                    plans.append((index, wanted))
                    continue
                if blocker is not None:
                    continue
                preferred = _preferred_permutation(value)
                if preferred is not None and preferred != tuple(range(rank)):
                    plans.append((index, preferred))
            permuted = [
                _permute(block.arguments[index], index, contract.args[index].display_name(index), permutation)
                for index, permutation in plans
            ]
            chosen = dict(plans)
            args = tuple(
                dataclasses.replace(arg, stored_permutation=chosen[index]) if index in chosen else arg
                for index, arg in enumerate(contract.args)
            )
            function_type = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
            main.attributes["function_type"] = ir.TypeAttr.get(
                ir.FunctionType.get([a.type for a in block.arguments], list(function_type.results))
            )
            dataclasses.replace(contract, args=args).write(main)
            verify(main)
        return PermuteReport(tuple(permuted), tuple(kept))

    def _fixed_layouts(self) -> dict[str, tuple[int, ...] | None]:
        """``layouts`` as ``{name: permutation}`` (None: torch's layout)."""
        fixed: dict[str, tuple[int, ...] | None] = {}
        for entry in self.layouts:
            name, colon, spec = entry.rpartition(":")
            if not colon or not name:
                raise PassError(f"{self.name}: layouts entry '{entry}' is not NAME:torch or NAME:P0.P1...")
            if name in fixed:
                raise PassError(f"{self.name}: layouts names '{name}' twice")
            if spec == TORCH_LAYOUT:
                fixed[name] = None
                continue
            parts = spec.split(".")
            if not all(part.isdigit() for part in parts):
                raise PassError(
                    f"{self.name}: layouts entry '{entry}': '{spec}' is neither 'torch' nor a permutation "
                    "written P0.P1..."
                )
            fixed[name] = tuple(int(part) for part in parts)
        return fixed


def _blocker(contract: Signature, index: int, arg: ArgRecord) -> str | None:
    """Why argument ``index`` must stay in torch's layout, or None."""
    if arg.kind not in ("parameter", "buffer", "constant"):
        return "it is not module state"
    if arg.overwritten or any(result.mutates == index for result in contract.results):
        return "the program writes or donates it"
    if any(record.base == A.arg_key(index) for record in contract.removed):
        return "it is the base of a rebuilt view"
    if arg.sharding is not None:
        return "it is sharded"
    return None


def _kernel_numbers(use: ir.OpOperand) -> _stablehlo.ConvDimensionNumbers | None:
    """The dimension numbers of the convolution whose kernel ``use`` is, or None."""
    owner = use.owner
    operation = owner.operation if isinstance(owner, ir.OpView) else owner
    if not isinstance(operation, ir.Operation) or operation.name != "stablehlo.convolution":
        return None
    if use.operand_number != 1 or "batch_group_count" in operation.attributes and (
        ir.IntegerAttr(operation.attributes["batch_group_count"]).value != 1
    ):
        return None
    return _stablehlo.ConvDimensionNumbers(operation.attributes["dimension_numbers"])


def _preferred_permutation(value: ir.Value) -> tuple[int, ...] | None:
    """The permutation every use of ``value`` wants (all are convolution
    kernels reading HWIO-ordered dimensions), or None."""
    uses = list(value.uses)
    if not uses:
        return None
    wanted: tuple[int, ...] | None = None
    for use in uses:
        numbers = _kernel_numbers(use)
        if numbers is None:
            return None
        permutation = (
            *numbers.kernel_spatial_dimensions,
            numbers.kernel_input_feature_dimension,
            numbers.kernel_output_feature_dimension,
        )
        if wanted is not None and permutation != wanted:
            return None
        wanted = permutation
    return wanted


def _permute(value: ir.Value, index: int, name: str, permutation: tuple[int, ...]) -> PermutedState:
    """Give ``value`` (a block argument) the permuted type; convolution
    kernels read the permuted dimensions, other uses a transpose back."""
    inverse = inverse_permutation(permutation)
    old_type = ir.RankedTensorType(value.type)
    shape = list(old_type.shape)
    uses = [(use.owner, use.operand_number, _kernel_numbers(use)) for use in value.uses]
    value.set_type(ir.RankedTensorType.get([shape[d] for d in permutation], old_type.element_type))
    back: ir.Value | None = None
    kernel_uses = 0
    for owner, operand_number, numbers in uses:
        operation = owner.operation if isinstance(owner, ir.OpView) else owner
        if numbers is not None:
            operation.attributes["dimension_numbers"] = _stablehlo.ConvDimensionNumbers.get(
                input_batch_dimension=numbers.input_batch_dimension,
                input_feature_dimension=numbers.input_feature_dimension,
                input_spatial_dimensions=list(numbers.input_spatial_dimensions),
                kernel_input_feature_dimension=inverse[numbers.kernel_input_feature_dimension],
                kernel_output_feature_dimension=inverse[numbers.kernel_output_feature_dimension],
                kernel_spatial_dimensions=[inverse[d] for d in numbers.kernel_spatial_dimensions],
                output_batch_dimension=numbers.output_batch_dimension,
                output_feature_dimension=numbers.output_feature_dimension,
                output_spatial_dimensions=list(numbers.output_spatial_dimensions),
            )
            kernel_uses += 1
            continue
        if back is None:
            block = value.owner
            first = block.operations[0] if len(block.operations) else None
            with ir.InsertionPoint(first) if first is not None else ir.InsertionPoint(block):
                back = ir.Operation.create(
                    "stablehlo.transpose", results=[old_type], operands=[value],
                    attributes={"permutation": ir.DenseI64ArrayAttr.get(list(inverse))},
                ).results[0]
        operation.operands[operand_number] = back
    return PermutedState(index, name, permutation, kernel_uses, len(uses) - kernel_uses)
