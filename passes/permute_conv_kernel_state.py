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
Since a permuted shape can equal the logical one (a 3x3x3x3 kernel), the
module also says ``hloalias.state_form = "stored"``: ``@main``'s calling
convention is the runtime's, and ``hloalias-opt --xla-compile`` (every path
to XLA but the runtime's) refuses the module without ``--allow-stored-state``.
The runtime uploads that state permuted, and ``state_dict()`` /
``load_state_dict`` apply the inverse, so users only ever see torch's layout.

XLA swaps the operands of a convolution whose kernel window is larger than
its input (ResNet's last 3x3 convolutions on a 2x2 map) and then reads the
kernel reversed along the swapped spatial dimensions: another copy, as large
as the weight.  For such a convolution (XLA's own test, ``ConvOperandSwapper``:
no feature or batch groups, kernel window product larger than the swapped
one) the state is also stored flipped along those dimensions
(``hloalias.stored_reversed``) and the convolution reads it with
``window_reversal`` there: the same convolution, and XLA's reverse cancels.

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
keeps torch's layout, ``NAME:2.3.1.0`` stores ``permute(2, 3, 1, 0)`` and
``NAME:2.3.1.0/0.1`` also flips stored dimensions 0 and 1, for any
read-only use (a ``stablehlo.transpose`` back feeds uses that are not
convolution kernels, and a ``stablehlo.reverse`` first for flipped
dimensions).  A named argument that must stay in torch's layout
(written, donated, a view's base, sharded) is left so and reported; names
the module does not have are ignored."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
from torch_mlir import ir
from torch_mlir._mlir_libs import _stablehlo

from hloalias import attributes as A
from hloalias.contract import ArgRecord, Signature, StoredLayout, verify
from hloalias.errors import PassError
from hloalias.mlir import find_main
from hloalias.passes.base import ModuleLike, ModulePass, as_module_like

TORCH_LAYOUT = "torch"


@dataclasses.dataclass(frozen=True)
class PermutedState:
    """One state argument now stored in another layout."""

    arg_index: int
    name: str
    layout: StoredLayout
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
            lines.append(f"  '{entry.name}' (argument {entry.arg_index}): {entry.layout.describe()}; {uses}")
        for name, reason in self.kept_in_torch_layout:
            lines.append(f"  '{name}' kept in torch's layout despite its fixed layout: {reason}")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class PermuteConvKernelState(ModulePass[PermuteReport]):
    """Store read-only state used only as convolution kernels in the kernel's layout."""

    name: ClassVar[str] = "permute-conv-kernel-state"

    layouts: tuple[str, ...] = dataclasses.field(
        default=(),
        metadata={"help": "fixed layouts of existing state: NAME:torch, NAME:P0.P1... or NAME:P0.P1.../R0.R1..."},
    )

    def apply(self, module: ModuleLike) -> PermuteReport:
        """Store every eligible state argument of ``@main`` permuted, in
        place.  Everything is checked before anything changes: a malformed
        ``layouts`` entry, or one that contradicts a layout the module
        already records, is a :class:`PassError`."""
        module = as_module_like(module)
        fixed = self._fixed_layouts()
        with module.context, ir.Location.unknown():
            main = find_main(module)
            contract = verify(main)
            block = main.regions[0].blocks[0]
            plans: list[tuple[int, StoredLayout]] = []
            kept: list[tuple[str, str]] = []
            for index, arg in enumerate(contract.args):
                name = arg.display_name(index)
                value = block.arguments[index]
                rank = ir.RankedTensorType(value.type).rank
                wanted = fixed.get(name)
                if wanted is not None and not wanted.valid_for(rank):
                    raise PassError(
                        f"{self.name}: layout '{wanted.spec()}' of '{name}' is not a permutation (and sorted "
                        f"distinct reversed dimensions) of the dimensions of {value.type}"
                    )
                if arg.stored_layout is not None:
                    if name in fixed and wanted != arg.stored_layout:
                        shown = TORCH_LAYOUT if wanted is None else wanted.spec()
                        raise PassError(
                            f"{self.name}: '{name}' is already stored as {arg.stored_layout.describe()}; "
                            f"cannot store it as '{shown}'"
                        )
                    continue
                blocker = _blocker(contract, index, arg)
                if name in fixed:
                    if wanted is None or wanted.is_identity():
                        continue
                    if blocker is not None:
                        kept.append((name, blocker))
                        continue
                    plans.append((index, wanted))
                    continue
                if blocker is not None:
                    continue
                preferred = _preferred_layout(value)
                if preferred is not None and not preferred.is_identity():
                    plans.append((index, preferred))
            permuted = [
                _store(block.arguments[index], index, contract.args[index].display_name(index), layout)
                for index, layout in plans
            ]
            chosen = dict(plans)
            args = tuple(
                dataclasses.replace(arg, stored_layout=chosen[index]) if index in chosen else arg
                for index, arg in enumerate(contract.args)
            )
            function_type = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
            main.attributes["function_type"] = ir.TypeAttr.get(
                ir.FunctionType.get([a.type for a in block.arguments], list(function_type.results))
            )
            dataclasses.replace(contract, args=args).write(main)
            verify(main)
            # @main's calling convention is no longer torch's even where no
            # type changed: say so on the module, for every consumer.
            _mark_state_form(main, any(arg.stored_layout is not None for arg in args))
        return PermuteReport(tuple(permuted), tuple(kept))

    def _fixed_layouts(self) -> dict[str, StoredLayout | None]:
        """``layouts`` as ``{name: layout}`` (None: torch's layout)."""
        fixed: dict[str, StoredLayout | None] = {}
        for entry in self.layouts:
            name, colon, spec = entry.rpartition(":")
            if not colon or not name:
                raise PassError(f"{self.name}: layouts entry '{entry}' is not NAME:torch or NAME:P0.P1...")
            if name in fixed:
                raise PassError(f"{self.name}: layouts names '{name}' twice")
            if spec == TORCH_LAYOUT:
                fixed[name] = None
                continue
            try:
                fixed[name] = StoredLayout.from_spec(spec)
            except ValueError:
                raise PassError(
                    f"{self.name}: layouts entry '{entry}': '{spec}' is neither 'torch' nor a layout written "
                    "P0.P1... or P0.P1.../R0.R1..."
                ) from None
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


def _convolution(use: ir.OpOperand) -> ir.Operation | None:
    """The convolution whose kernel ``use`` is (without batch groups), or None."""
    owner = use.owner
    operation = owner.operation if isinstance(owner, ir.OpView) else owner
    if not isinstance(operation, ir.Operation) or operation.name != "stablehlo.convolution":
        return None
    if use.operand_number != 1 or _integer(operation, "batch_group_count", 1) != 1:
        return None
    return operation


def _integer(operation: ir.Operation, name: str, default: int) -> int:
    return int(ir.IntegerAttr(operation.attributes[name]).value) if name in operation.attributes else default


def _window(operation: ir.Operation, name: str, count: int, default: int) -> list[int]:
    if name not in operation.attributes:
        return [default] * count
    return [int(v) for v in ir.DenseI64ArrayAttr(operation.attributes[name])]


def _reversal(operation: ir.Operation, count: int) -> list[bool]:
    if "window_reversal" not in operation.attributes:
        return [False] * count
    return [bool(v) for v in ir.DenseBoolArrayAttr(operation.attributes["window_reversal"])]


def _swapped_spatial_dims(operation: ir.Operation) -> list[int]:
    """The spatial indices along which XLA, swapping this convolution's
    operands (its kernel window is larger than its input), reverses the
    kernel; empty when it does not swap.  XLA's test (ConvOperandSwapper):
    no feature groups; a spatial dimension that is a pure contraction (the
    window covers the unpadded input) or a group dimension keeps its place;
    the others multiply the kernel window product and the swapped one (the
    input size), and XLA swaps when the kernel's is larger."""
    numbers = _stablehlo.ConvDimensionNumbers(operation.attributes["dimension_numbers"])
    if _integer(operation, "feature_group_count", 1) != 1:
        return []
    spatial = list(numbers.input_spatial_dimensions)
    count = len(spatial)
    kernel_shape = list(ir.RankedTensorType(operation.operands[1].type).shape)
    input_shape = list(ir.RankedTensorType(operation.operands[0].type).shape)
    strides = _window(operation, "window_strides", count, 1)
    lhs_dilation = _window(operation, "lhs_dilation", count, 1)
    rhs_dilation = _window(operation, "rhs_dilation", count, 1)
    reversal = _reversal(operation, count)
    padding = (
        np.array(ir.DenseIntElementsAttr(operation.attributes["padding"])).reshape(count, 2).tolist()
        if "padding" in operation.attributes else [[0, 0]] * count
    )
    kernel_product = swapped_product = 1
    reversed_dims = []
    for s in range(count):
        size = kernel_shape[numbers.kernel_spatial_dimensions[s]]
        input_size = input_shape[spatial[s]]
        low, high = padding[s]
        plain = not reversal[s] and low == 0 and high == 0 and rhs_dilation[s] == 1
        is_group = plain and lhs_dilation[s] == size and strides[s] == size - 1
        is_contraction = plain and size == input_size and lhs_dilation[s] == 1 and strides[s] == 1
        if is_group or is_contraction:
            continue
        kernel_product *= size
        full_pad = input_size == 1 and strides[s] == 1 and rhs_dilation[s] == 1 and low == high == size - 1
        swapped_product *= size if full_pad else input_size
        if not reversal[s]:
            reversed_dims.append(s)
    return reversed_dims if kernel_product > swapped_product else []


def _wanted_layout(operation: ir.Operation) -> StoredLayout:
    """The layout XLA:CPU's convolution ``operation`` reads its kernel in:
    spatial dimensions, input feature, output feature (HWIO), flipped along
    the spatial dimensions XLA reverses when it swaps the operands."""
    numbers = _stablehlo.ConvDimensionNumbers(operation.attributes["dimension_numbers"])
    permutation = (
        *numbers.kernel_spatial_dimensions,
        numbers.kernel_input_feature_dimension,
        numbers.kernel_output_feature_dimension,
    )
    # Spatial index s is stored dimension s in this order.
    return StoredLayout(tuple(permutation), tuple(_swapped_spatial_dims(operation)))


def _preferred_layout(value: ir.Value) -> StoredLayout | None:
    """The layout every use of ``value`` wants (all are convolution kernels
    wanting the same one), or None."""
    uses = list(value.uses)
    if not uses:
        return None
    wanted: StoredLayout | None = None
    for use in uses:
        operation = _convolution(use)
        if operation is None:
            return None
        layout = _wanted_layout(operation)
        if wanted is not None and layout != wanted:
            return None
        wanted = layout
    return wanted


def _store(value: ir.Value, index: int, name: str, layout: StoredLayout) -> PermutedState:
    """Give ``value`` (a block argument) the stored type; convolution
    kernels read the stored dimensions (with ``window_reversal`` toggled on
    flipped ones), other uses a reverse and a transpose back."""
    inverse = layout.inverse
    old_type = ir.RankedTensorType(value.type)
    shape = list(old_type.shape)
    uses = [(use.owner, use.operand_number, _convolution(use)) for use in value.uses]
    value.set_type(ir.RankedTensorType.get([shape[d] for d in layout.permutation], old_type.element_type))
    back: ir.Value | None = None
    kernel_uses = 0
    for owner, operand_number, convolution in uses:
        if convolution is not None:
            _read_stored_kernel(convolution, inverse, layout.reversed)
            kernel_uses += 1
            continue
        operation = owner.operation if isinstance(owner, ir.OpView) else owner
        if back is None:
            back = _torch_layout_value(value, old_type, layout)
        operation.operands[operand_number] = back
    return PermutedState(index, name, layout, kernel_uses, len(uses) - kernel_uses)


def _read_stored_kernel(convolution: ir.Operation, inverse: tuple[int, ...], flipped: tuple[int, ...]) -> None:
    """Point ``convolution``'s kernel dimension numbers at the stored
    dimensions; toggle ``window_reversal`` on the flipped spatial ones."""
    numbers = _stablehlo.ConvDimensionNumbers(convolution.attributes["dimension_numbers"])
    spatial = [inverse[d] for d in numbers.kernel_spatial_dimensions]
    convolution.attributes["dimension_numbers"] = _stablehlo.ConvDimensionNumbers.get(
        input_batch_dimension=numbers.input_batch_dimension,
        input_feature_dimension=numbers.input_feature_dimension,
        input_spatial_dimensions=list(numbers.input_spatial_dimensions),
        kernel_input_feature_dimension=inverse[numbers.kernel_input_feature_dimension],
        kernel_output_feature_dimension=inverse[numbers.kernel_output_feature_dimension],
        kernel_spatial_dimensions=spatial,
        output_batch_dimension=numbers.output_batch_dimension,
        output_feature_dimension=numbers.output_feature_dimension,
        output_spatial_dimensions=list(numbers.output_spatial_dimensions),
    )
    if flipped:
        reversal = _reversal(convolution, len(spatial))
        toggled = [reversal[s] != (spatial[s] in flipped) for s in range(len(spatial))]
        convolution.attributes["window_reversal"] = ir.DenseBoolArrayAttr.get(toggled)


def _torch_layout_value(value: ir.Value, torch_type: ir.RankedTensorType, layout: StoredLayout) -> ir.Value:
    """``value`` (stored) back in torch's layout, computed at the top of its block."""
    block = value.owner
    first = block.operations[0] if len(block.operations) else None
    with ir.InsertionPoint(first) if first is not None else ir.InsertionPoint(block):
        current = value
        if layout.reversed:
            current = ir.Operation.create(
                "stablehlo.reverse", results=[value.type], operands=[current],
                attributes={"dimensions": ir.DenseI64ArrayAttr.get(list(layout.reversed))},
            ).results[0]
        return ir.Operation.create(
            "stablehlo.transpose", results=[torch_type], operands=[current],
            attributes={"permutation": ir.DenseI64ArrayAttr.get(list(layout.inverse))},
        ).results[0]


def _mark_state_form(main: ir.Operation, stored: bool) -> None:
    """Set (or, with no state stored permuted, drop) the module's
    ``hloalias.state_form = "stored"`` (see :data:`hloalias.attributes.MODULE_STATE_FORM`)."""
    module = main.operation.parent
    if module is None or module.name != "builtin.module":
        return
    attributes = module.attributes
    if stored:
        attributes[A.MODULE_STATE_FORM] = ir.StringAttr.get("stored")
    elif A.MODULE_STATE_FORM in attributes:
        del attributes[A.MODULE_STATE_FORM]
