"""The ``torch.compile`` backend ``"hloalias"``: each graph dynamo hands
over is compiled by ``hloalias.compile``, per concrete input signature.

Registered through torch's ``torch_dynamo_backends`` entry point
(``pyproject.toml``), so ``torch.compile(m, backend="hloalias")`` works
without importing hloalias first; torch loads :func:`hloalias_backend`
from here on first use of the name.  ``backend=hloalias_backend`` works
too, and ``options={"pipeline": ..., "device": ..., "cache_size": ...}``
reach every compile.

What dynamo hands a backend, and what is done with it:

- **Inference** (grad disabled, or no input requires grad): dynamo's FX
  graph as traced, not functionalized, with the module's parameters and
  buffers lifted as graph inputs (torch's default since nn modules are
  inlined) and in-place ops (``buf.add_``, ``cache.index_copy_``) on them.
  The graph goes to ``hloalias.compile`` as it is: ``torch.export``
  functionalizes it, ``alias-donated-buffers`` aliases every mutated input
  to its new value, and the runtime updates the caller's tensor in place
  (the module's own buffer, moved onto the runtime buffer on the first call,
  donated and written in place by XLA afterwards): no copy back.  Returned
  views of inputs come back as real views.  (An AOTAutograd-based backend
  such as torch_xla's ``openxla`` instead compiles the functionalized graph,
  which returns each mutation as a new tensor that AOTAutograd copies back
  with ``copy_``: XLA makes no alias and the device holds both values.)
- **Training** (grad enabled and some input requires grad): AOTAutograd
  (``torch._dynamo.backends.common.aot_autograd``) splits forward and
  backward; both graphs are compiled by ``hloalias.compile`` per signature.
  Buffer mutations in such graphs (BatchNorm statistics) are copied back by
  AOTAutograd, as for any AOTAutograd backend.  ``opt.step()`` outside the
  compiled function runs eagerly on the gradients it left.
- **Shapes**: every graph is wrapped in a :class:`~hloalias.runtime.jit_cache.Jit`,
  so a call with new shapes compiles once more and is cached.  When dynamo
  marks a dimension dynamic (the second shape it sees, by default) it
  passes the size as an int input.  Where every int input of a graph is a
  dimension of one of its tensor inputs (:func:`_sizes_of_tensors`), the
  Jit is of the graph called with the tensors only, each size read from
  its tensor (:class:`_SizedGraph`): one executable per size, and from the
  graph's second size on, each new size is specialized from one dynamic
  export of the graph (:mod:`hloalias.runtime.shape_family`), no
  ``torch.export`` per size.  A call whose int is not its tensor's size
  (dynamo's guards rule it out) runs the graph as given, the int one more
  input the Jit specializes on; so does every graph with another int.
  With ``dynamic=True`` dynamo also passes the Python floats the code
  reads (``Dropout.p``, ``eps``, ``math.pi``) as 0-d tensors the graph
  reads with ``.item()``: they are passed as numbers, one executable per
  value (:func:`_numbers_as_inputs`).  Where such a graph's ints are sizes
  of its tensors as above, each distinct set of number values has a
  :class:`_SizedGraph` of its own with the values fixed in it (at most
  ``cache_size`` of them, least recently used dropped), so its sizes form a
  shape family as well.  Guards and graph breaks are
  dynamo's; each subgraph between breaks is a graph of its own here.

- **Across processes**: each graph's compile goes through
  ``hloalias.compile``'s program cache (:mod:`hloalias.runtime.program_cache`),
  keyed by the graph's generated code and the metadata of what it reads
  (:mod:`hloalias.runtime.source_key`): a fresh process that compiles a
  model compiled before gets every graph's final program from the disk
  cache (and its executable from XLA's entry), with no ``torch.export``,
  lowering, passes or XLA compile; dynamo's own tracing still runs.

:func:`compiled_graphs` lists the graphs compiled so far (live ones);
:func:`explain` reports each with its signatures, compiles and cache hits."""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hloalias.errors import ExecutionError
from hloalias.lru import BoundedLRU
from hloalias.runtime.executable import Executable
from hloalias.runtime.jit_cache import Jit, JitStats, default_cache_size
from hloalias.runtime.state import bring_up_to_date

_OPTIONS = ("pipeline", "device", "cache_size")
_TORCH_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class _AotJit(Jit):
    """A Jit for AOTAutograd's graphs: they are called inside an
    ``autograd.Function``'s forward/backward, whose thread-local dispatch
    state (autograd and functionalization keys excluded) breaks
    ``torch.export``'s functionalization; a compile runs in a fresh
    thread, with grad disabled as AOTAutograd runs these graphs."""

    def _compile(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Executable:
        result: list[Executable] = []
        failure: list[BaseException] = []

        def run() -> None:
            try:
                with torch.no_grad():
                    result.append(Jit._compile(self, args, kwargs))
            except BaseException as error:  # re-raised in the caller's thread
                failure.append(error)

        worker = threading.Thread(target=run, name="hloalias-aot-compile")
        worker.start()
        worker.join()
        if failure:
            raise failure[0]
        return result[0]


class _SizedGraph(torch.nn.Module):
    """A dynamo graph whose int inputs are sizes of its tensor inputs
    (dynamo's automatic dynamic shapes: ``s0`` beside ``x`` of shape
    ``(1, s0)``), called with the tensors only: each size is read from
    its tensor (``sizes[k] = (position, tensor position, dimension)``),
    and each number input (:func:`_numbers_as_inputs`) is the value fixed
    here (``numbers[k] = (position, value)``), so the compiled program's
    inputs are tensors and a new size is a new shape of the same module,
    which the shape family specializes (:mod:`hloalias.runtime.shape_family`).
    The graph's code is fixed once handed over, so it keys the family
    itself, with the numbers' values."""

    #: Dynamo made these sizes symbolic after seeing two of them, so the
    #: family's dynamic export waits for one more size only.
    shape_family_static_sizes = 1

    def __init__(self, graph: torch.fx.GraphModule, sizes: tuple[tuple[int, int, int], ...], count: int,
                 numbers: tuple[tuple[int, Any], ...] = ()) -> None:
        super().__init__()
        self.graph = graph
        self.sizes = sizes
        self.count = count
        self.numbers = numbers

    def forward(self, *tensors: Any) -> Any:
        size_at = {position: (tensor, dim) for position, tensor, dim in self.sizes}
        fixed = dict(self.numbers)
        kept = iter(tensors)
        full: list[Any] = [fixed.get(i) if i in size_at or i in fixed else next(kept) for i in range(self.count)]
        for position, (tensor, dim) in size_at.items():
            full[position] = full[tensor].size(dim)
        return self.graph(*full)

    def shape_family_key(self) -> str:
        # repr tells 1 from 1.0 and True, and -0.0 from 0.0: each a program of its own.
        return f"dynamo graph {self.graph.code!r} sizes {self.sizes} numbers {self.numbers!r}"


def _sizes_of_tensors(graph: torch.fx.GraphModule,
                      numbers: frozenset[int] = frozenset()) -> tuple[tuple[int, int, int], ...] | None:
    """For a graph whose every non-tensor input (other than the number
    inputs at ``numbers``) is a size dynamo made symbolic, and that size is
    a dimension of one of its tensor inputs: ``(position, tensor position,
    dimension)`` for each; else None."""
    placeholders = [node for node in graph.graph.nodes if node.op == "placeholder"]
    examples = [node.meta.get("example_value") for node in placeholders]
    dims: dict[Any, tuple[int, int]] = {}
    for position, example in enumerate(examples):
        if isinstance(example, torch.Tensor) and position not in numbers:
            for dim, size in enumerate(example.shape):
                if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                    dims.setdefault(size.node.expr, (position, dim))
    sizes = []
    for position, example in enumerate(examples):
        if isinstance(example, torch.Tensor) or position in numbers:
            continue
        if not isinstance(example, torch.SymInt) or example.node.expr not in dims:
            return None
        sizes.append((position, *dims[example.node.expr]))
    return tuple(sizes) if sizes else None


class CompiledGraph:
    """One graph dynamo (or AOTAutograd) handed over: called with the
    graph's inputs, it runs the executable of their signature."""

    #: Each call brings the graph's inputs up to date itself (``__call__``):
    #: dynamo's graphs that traced stale tensors are not wrapped to do it
    #: again (``runtime/state.py``).
    brings_inputs_up_to_date = True

    def __init__(self, graph: torch.fx.GraphModule, kind: str, number: int, options: dict[str, Any], boxed: bool = False) -> None:
        self.kind = kind
        self.number = number
        #: Inputs the graph only reads as Python numbers (``.item()``), passed as such.
        self.scalar_positions = _numbers_as_inputs(graph) if not boxed else frozenset()
        self.code = graph.code
        #: Where every int input is a size of a tensor input: the Jit is of
        #: the graph called with the tensors only (:class:`_SizedGraph`).
        self.sizes = _sizes_of_tensors(graph, self.scalar_positions) if not boxed else None
        self._graph = graph
        self._options = options
        self._count = len([node for node in graph.graph.nodes if node.op == "placeholder"])
        #: ``options["cache_size"]``, else ``HLOALIAS_JIT_CACHE_SIZE`` (read now).
        self._cache_size: int = options["cache_size"] if "cache_size" in options else default_cache_size()
        #: What Jits dropped from ``_jits`` did, kept in :attr:`stats`.
        self._dropped = JitStats()
        #: The Jit of each set of number values (the values' reprs; one set,
        #: empty, without number inputs), least recently used first, at most
        #: ``cache_size`` (a dropped Jit's counts go to ``_dropped``; the
        #: callback holds that, not ``self``: no reference cycle).
        self._jits: BoundedLRU[tuple[str, ...], Jit] = BoundedLRU(
            self._cache_size, on_evict=functools.partial(_keep_counts, self._dropped))
        if self.sizes is None:
            self._jits.put((), (_AotJit if boxed else Jit)(graph, **self._jit_options()))
        elif not self.scalar_positions:
            self._jits.put((), Jit(_SizedGraph(graph, self.sizes, self._count), **self._jit_options()))
        #: The graph as dynamo gave it, for a call whose ints are not its tensors' sizes.
        self._unsized: Jit | None = None
        #: AOTAutograd calls a compiled graph with one list when this is set.
        self._boxed_call = boxed

    def _jit_options(self) -> dict[str, Any]:
        return {"pipeline": self._options.get("pipeline"), "device": self._options.get("device"),
                "cache_size": self._cache_size}

    @property
    def jit(self) -> Jit:
        """The Jit of the number values called last (the only one of a
        graph without number inputs)."""
        newest = self._jits.newest()
        if newest is None:
            raise ExecutionError(f"dynamo graph {self.number}: not called yet, no Jit of its number values")
        return newest

    def _sized_jit(self, args: tuple[Any, ...]) -> Jit:
        """The Jit of the :class:`_SizedGraph` with ``args``' number values fixed."""
        numbers = tuple((i, args[i]) for i in sorted(self.scalar_positions))
        key = tuple(repr(value) for _, value in numbers)
        jit = self._jits.get(key)
        if jit is not None:
            return jit
        assert self.sizes is not None
        jit = Jit(_SizedGraph(self._graph, self.sizes, self._count, numbers), **self._jit_options())
        self._jits.put(key, jit)
        return jit

    @property
    def stats(self) -> JitStats:
        """Compiles, cache hits and evictions of this graph's executables
        (of every set of number values)."""
        jits = list(self._jits.values())
        return JitStats(
            compiles=self._dropped.compiles + sum(j.stats.compiles for j in jits),
            hits=self._dropped.hits + sum(j.stats.hits for j in jits),
            evictions=self._dropped.evictions + sum(j.stats.evictions for j in jits),
        )

    def __call__(self, *args: Any) -> Any:
        if self.scalar_positions:
            # The 0-d tensors dynamo made of Python numbers: their values
            # (each distinct value its own executable, as sizes).
            args = tuple(a.item() if i in self.scalar_positions else a for i, a in enumerate(args))
        # A module tensor that executables of hloalias.compile/jit of the
        # same module updated on the device holds a stale value until it is
        # brought up to date (what eager would read).
        if self._boxed_call:
            (inputs,) = args
            arguments = tuple(inputs)
            inputs.clear()  # the boxed convention: the callee owns (and frees) the list
            bring_up_to_date(arguments)
            return list(self.jit(*arguments))
        bring_up_to_date(args)
        if self.sizes is not None:
            if all(args[p] == args[t].size(d) for p, t, d in self.sizes):
                positions = {p for p, _, _ in self.sizes} | self.scalar_positions
                jit = self._sized_jit(args)
                return jit(*(a for i, a in enumerate(args) if i not in positions))
            # Not dynamo's own binding of the sizes (its guards make this
            # unreachable): the graph as given, each int its own program.
            if self._unsized is None:
                self._unsized = Jit(self._graph, pipeline=self._options.get("pipeline"),
                                    device=self._options.get("device"), cache_size=self._cache_size)
            return self._unsized(*args)
        return self.jit(*args)

    def explain(self) -> str:
        """The graph's kind and number, then its Jits' reports."""
        reports = [jit.explain() for jit in self._jits.values()]
        return f"dynamo graph {self.number} ({self.kind})\n" + "\n".join(reports or ["not called yet"])


def _keep_counts(dropped: JitStats, _key: tuple[str, ...], jit: Jit) -> None:
    """Add what an evicted Jit did (its cached signatures as evictions) to
    its graph's ``dropped`` counts."""
    dropped.compiles += jit.stats.compiles
    dropped.hits += jit.stats.hits
    dropped.evictions += jit.stats.evictions + len(jit.signatures)


def _numbers_as_inputs(graph: torch.fx.GraphModule) -> frozenset[int]:
    """With ``dynamic=True`` dynamo passes a Python float the code reads
    (``Dropout.p``, ``self.scale``) as a 0-d tensor input that the graph
    turns back into a number (``.item()``): ``torch.export`` would trace
    that as a data-dependent value, which no XLA program can hold.  Each
    such input whose every use is ``.item()`` becomes a number input
    instead (the ``.item()`` calls are removed from ``graph``, in place),
    which the Jit specializes on, as on sizes: a new value compiles once
    more, never runs the old value's program.  Returns their positions."""
    positions = set()
    placeholders = [node for node in graph.graph.nodes if node.op == "placeholder"]
    for position, node in enumerate(placeholders):
        example = node.meta.get("example_value")
        if not isinstance(example, torch.Tensor) or example.dim() != 0 or not node.users:
            continue
        uses = list(node.users)
        if not all(use.op == "call_method" and use.target == "item" and use.args == (node,) and not use.kwargs for use in uses):
            continue
        for use in uses:
            use.replace_all_uses_with(node)
            graph.graph.erase_node(use)
        positions.add(position)
    if positions:
        graph.recompile()
    return frozenset(positions)


_GRAPHS: "weakref.WeakValueDictionary[int, CompiledGraph]" = weakref.WeakValueDictionary()
_COUNT = [0]
_LOCK = threading.Lock()


def _register(graph: torch.fx.GraphModule, kind: str, options: dict[str, Any], boxed: bool = False) -> CompiledGraph:
    with _LOCK:
        number = _COUNT[0]
        _COUNT[0] += 1
    compiled = CompiledGraph(graph, kind, number, options, boxed)
    _GRAPHS[number] = compiled
    return compiled


def compiled_graphs() -> list[CompiledGraph]:
    """The graphs compiled by the backend that are still alive, in order."""
    return [graph for _, graph in sorted(_GRAPHS.items())]


def explain() -> str:
    """Every live compiled graph's report (see :meth:`CompiledGraph.explain`)."""
    graphs = compiled_graphs()
    if not graphs:
        return "hloalias dynamo backend: no graphs compiled"
    return "\n".join(graph.explain() for graph in graphs)


def _needs_autograd(example_inputs: Sequence[Any]) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(value, torch.Tensor) and value.requires_grad for value in example_inputs
    )


def _checked_options(options: dict[str, Any] | None) -> dict[str, Any]:
    from hloalias.errors import CompileError

    options = dict(options or {})
    # torch.compile's ``mode`` chooses among Inductor's strategies (CUDA
    # graphs, autotuning); Hugging Face's recipe passes "reduce-overhead".
    # XLA compiles each graph one way and the call path is already the
    # lean one, so a mode torch knows is accepted and changes nothing.
    mode = options.pop("mode", None)
    if mode not in _TORCH_MODES:
        raise CompileError(
            f"hloalias backend: mode={mode!r} is not one of torch.compile's modes {list(_TORCH_MODES[1:])} "
            "(all accepted, none changes what hloalias compiles)"
        )
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise CompileError(f"hloalias backend: unknown option(s) {unknown}; known: {list(_OPTIONS)}")
    return options


def hloalias_backend(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: dict[str, Any] | None = None, **kwargs: Any,
) -> Callable[..., Any]:
    """The dynamo backend: ``torch.compile(m, backend="hloalias")`` (see
    the module docstring).  ``options`` (or keyword options) are
    ``pipeline``, ``device`` and ``cache_size``."""
    settings = _checked_options({**(options or {}), **kwargs})
    if not _needs_autograd(example_inputs):
        return _register(gm, "inference", settings)

    from torch._dynamo.backends.common import aot_autograd

    def compiler(kind: str) -> Callable[[torch.fx.GraphModule, Sequence[Any]], Callable[..., Any]]:
        def compile_graph(graph: torch.fx.GraphModule, _inputs: Sequence[Any]) -> Callable[..., Any]:
            return _register(graph, kind, settings, boxed=True)
        return compile_graph

    from torch.nn.attention import SDPBackend, sdpa_kernel

    from hloalias.frontend.backward_decompositions import capture_decompositions

    # AOTAutograd traces the joint graph here, as the training capture
    # traces a step: with the backward operators torch-mlir lacks
    # decomposed, and SDPA in its math form (its fused CPU kernel's
    # backward has no lowering).
    with sdpa_kernel(SDPBackend.MATH):
        training: Callable[..., Any] = aot_autograd(
            fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
            inference_compiler=compiler("inference"), decompositions=capture_decompositions(),
        )(gm, example_inputs)
    return training
