"""hloalias's own passes over StableHLO, one per module, and the registry
that makes them available by name to pipelines and ``hloalias-opt``."""

from __future__ import annotations

from hloalias._layers import alias_bare_import

alias_bare_import(__name__, "hloalias.passes")

from collections.abc import Callable
from typing import Any

from hloalias.passes.accumulate_bf16_dots_in_f32 import AccumulateBf16DotsInF32, AccumulateReport
from hloalias.passes.alias_donated_buffers import AliasDonatedBuffers, AliasReport
from hloalias.passes.base import ModulePass
from hloalias.passes.bitcast_overwrite_scatter import BitcastOverwriteScatter, BitcastScatterReport
from hloalias.passes.elementwise_in_producer_shape import ElementwiseInProducerShape, ElementwiseShapeReport
from hloalias.passes.eliminate_view_results import EliminateViewResults, ViewReport
from hloalias.passes.fold_broadcast_into_dot_general import BroadcastFoldReport, FoldBroadcastIntoDotGeneral
from hloalias.passes.fold_repeat_into_dot_general import FoldRepeatIntoDotGeneral, RepeatFoldReport
from hloalias.passes.fold_transpose_into_dot_general import FoldReport, FoldTransposeIntoDotGeneral
from hloalias.passes.narrow_scatter_indices import NarrowIndicesReport, NarrowScatterIndices
from hloalias.passes.returned_matvec_as_reduce import MatvecReport, ReturnedMatvecAsReduce
from hloalias.passes.select_to_dynamic_update_slice import SelectToDynamicUpdateSlice, SelectToUpdateSliceReport
from hloalias.passes.scatter_to_dynamic_update_slice import ScatterToDynamicUpdateSlice, ScatterToUpdateSliceReport
from hloalias.passes.window_gather_indices import WindowGatherIndices, WindowGatherReport
from hloalias.passes.window_scatter_indices import WindowScatterIndices, WindowScatterReport
from hloalias.passes.one_hot_scatter_as_select import OneHotReport, OneHotScatterAsSelect
from hloalias.passes.order_in_place_updates import OrderInPlaceUpdates, OrderReport
from hloalias.passes.permute_conv_kernel_state import PermuteConvKernelState, PermuteReport
from hloalias.passes.recompute_for_late_readers import LateReadersReport, RecomputeForLateReaders
from hloalias.passes.recompute_shared_activations import RecomputeReport, RecomputeSharedActivations
from hloalias.passes.reduce_window_in_conv_layout import PoolLayoutReport, ReduceWindowInConvLayout
from hloalias.passes.store_state_as_bits import BitsReport, StoreStateAsBits
from hloalias.passes.widen_one_row_updates import WidenOneRowUpdates, WidenReport


def get_all_passes() -> dict[str, Callable[[str], ModulePass[Any]]]:
    """Pass name -> factory taking the pass's option text (``"a=1 b=2"``)."""
    return {
        AccumulateBf16DotsInF32.name: AccumulateBf16DotsInF32.from_options,
        AliasDonatedBuffers.name: AliasDonatedBuffers.from_options,
        BitcastOverwriteScatter.name: BitcastOverwriteScatter.from_options,
        ElementwiseInProducerShape.name: ElementwiseInProducerShape.from_options,
        EliminateViewResults.name: EliminateViewResults.from_options,
        FoldBroadcastIntoDotGeneral.name: FoldBroadcastIntoDotGeneral.from_options,
        FoldRepeatIntoDotGeneral.name: FoldRepeatIntoDotGeneral.from_options,
        FoldTransposeIntoDotGeneral.name: FoldTransposeIntoDotGeneral.from_options,
        NarrowScatterIndices.name: NarrowScatterIndices.from_options,
        ReturnedMatvecAsReduce.name: ReturnedMatvecAsReduce.from_options,
        WindowGatherIndices.name: WindowGatherIndices.from_options,
        WindowScatterIndices.name: WindowScatterIndices.from_options,
        ScatterToDynamicUpdateSlice.name: ScatterToDynamicUpdateSlice.from_options,
        SelectToDynamicUpdateSlice.name: SelectToDynamicUpdateSlice.from_options,
        OneHotScatterAsSelect.name: OneHotScatterAsSelect.from_options,
        OrderInPlaceUpdates.name: OrderInPlaceUpdates.from_options,
        PermuteConvKernelState.name: PermuteConvKernelState.from_options,
        RecomputeForLateReaders.name: RecomputeForLateReaders.from_options,
        RecomputeSharedActivations.name: RecomputeSharedActivations.from_options,
        ReduceWindowInConvLayout.name: ReduceWindowInConvLayout.from_options,
        StoreStateAsBits.name: StoreStateAsBits.from_options,
        WidenOneRowUpdates.name: WidenOneRowUpdates.from_options,
    }


__all__ = [
    "AccumulateBf16DotsInF32",
    "AccumulateReport",
    "AliasDonatedBuffers",
    "AliasReport",
    "BitsReport",
    "BitcastOverwriteScatter",
    "BitcastScatterReport",
    "BroadcastFoldReport",
    "ElementwiseInProducerShape",
    "ElementwiseShapeReport",
    "EliminateViewResults",
    "FoldBroadcastIntoDotGeneral",
    "FoldReport",
    "FoldRepeatIntoDotGeneral",
    "FoldTransposeIntoDotGeneral",
    "MatvecReport",
    "NarrowIndicesReport",
    "NarrowScatterIndices",
    "LateReadersReport",
    "ModulePass",
    "OneHotReport",
    "OneHotScatterAsSelect",
    "OrderInPlaceUpdates",
    "OrderReport",
    "PermuteConvKernelState",
    "PermuteReport",
    "PoolLayoutReport",
    "RecomputeReport",
    "RecomputeForLateReaders",
    "RecomputeSharedActivations",
    "ReduceWindowInConvLayout",
    "RepeatFoldReport",
    "ReturnedMatvecAsReduce",
    "ScatterToDynamicUpdateSlice",
    "ScatterToUpdateSliceReport",
    "SelectToDynamicUpdateSlice",
    "SelectToUpdateSliceReport",
    "StoreStateAsBits",
    "ViewReport",
    "WindowGatherIndices",
    "WindowGatherReport",
    "WindowScatterIndices",
    "WindowScatterReport",
    "WidenOneRowUpdates",
    "WidenReport",
    "get_all_passes",
]
