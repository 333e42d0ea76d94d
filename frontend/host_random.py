"""Random numbers drawn on the host while a program is traced.

A program that draws with ``numpy.random`` or Python's ``random`` while
``torch.export`` or the training capture runs it gets numbers that become
constants of the compiled program: the same at every call, where eager
draws new ones at each call.  transformers' Wav2Vec2 and HuBERT do this in
train mode (SpecAugment's ``_compute_mask_indices`` calls
``np.random.rand`` and ``np.random.choice``): every compiled step masked
the same frames.  torch's own random ops are not affected (hloalias draws
them on the device at every call, ``frontend/random_key.py``).

Contract: :func:`refuse_host_random_draws` wraps a trace.  While it is
active, the module-level drawing functions of ``numpy.random`` (the
methods of its global ``RandomState``, when numpy is loaded) and of
``random`` (the methods of its global ``Random``) record the first draw
made on the tracing thread, with the innermost line of the traced
program (a number drawn by ``random`` counts at its first use: a
comparison, arithmetic, a conversion; one the program never uses is
harmless, as transformers' MusicGen draws its LayerDrop probability in
eval mode too and then does not test it; torch reads a float's value with
no call Python can see, so a number not seen used is warned about,
:class:`HostRandomWarning`); draws made while a module is imported (its top-level code runs
once per process, traced or not) do not count.  When the trace returns and a draw was recorded, the two global
generators are put back to their states before the trace (the caller's
sequence of numbers is as it was) and the given error type is raised,
naming the function and the line.  A trace that raises keeps its own
error; cut short (an error, Ctrl-C) after a draw on the tracing thread, it
puts the generators back too.  Whatever happens, the watched functions are
the originals again when :func:`refuse_host_random_draws` is left: each
put-back is one call of C code, which no Ctrl-C cuts short.  Generators
the program creates itself (``np.random.default_rng()``,
``random.Random()``) and functions imported by name before the trace
(``from numpy.random import rand``) are not watched.

The wrappers (one per drawing function, ~65 with numpy loaded) are built
once per process and report to the active trace's record; they are
built again only when a watched module's attributes changed (a function
replaced or added).  A trace inside a trace watches nothing of its own:
the outer one records (callers hold ``tracing_lock``).
"""
from __future__ import annotations

import _random
import collections
import contextlib
import functools
import operator
import random
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from hloalias.errors import TorchImportError
from hloalias.frontend.program_frames import innermost_on_stack

#: Methods of the global generators that draw nothing.
_NOT_DRAWS = frozenset({"seed", "get_state", "set_state", "getstate", "setstate", "get_bit_generator", "set_bit_generator"})


def _drawing_functions(module: ModuleType, generator: object) -> list[tuple[str, Callable[..., Any]]]:
    """The module's attributes that are bound methods of ``generator``."""
    found = []
    for name in dir(module):
        if name.startswith("_") or name in _NOT_DRAWS:
            continue
        value = getattr(module, name, None)
        if getattr(value, "__self__", None) is generator and callable(value):
            found.append((name, value))
    return found


class HostRandomWarning(UserWarning):
    """A number drawn by Python's ``random`` during a trace that no Python
    code used (torch may have read it: it would be a constant)."""


_USES = (
    "__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__", "__hash__", "__bool__",
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
    "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__divmod__", "__rdivmod__", "__pow__", "__rpow__",
    "__neg__", "__pos__", "__abs__", "__float__", "__int__", "__index__", "__round__", "__trunc__",
    "__floor__", "__ceil__", "__and__", "__rand__", "__or__", "__ror__", "__xor__", "__rxor__",
    "__lshift__", "__rlshift__", "__rshift__", "__rrshift__", "__invert__",
)


def _drawn(base: type) -> type:
    """A ``base`` (float or int) drawn by Python's ``random`` while a trace
    runs: any use of its value (a comparison, arithmetic, a conversion)
    calls its ``_on_use`` first."""

    def new(cls: type, value: Any, on_use: Callable[[], Any]) -> Any:
        drawn: Any = base.__new__(cls, value)
        drawn._on_use = on_use
        return drawn

    namespace: dict[str, Any] = {"__new__": new, "__doc__": _drawn.__doc__}
    for name in _USES:
        method = getattr(base, name, None)
        if method is None:
            continue

        def use(self: Any, *args: Any, _method: Any = method) -> Any:
            self._on_use()
            return _method(self, *args)

        namespace[name] = use
    return type(f"Drawn{base.__name__.title()}", (base,), namespace)


_DRAWN_TYPES: dict[type, type] = {float: _drawn(float), int: _drawn(int)}


def _importing() -> bool:
    """Whether a module is being imported on this stack: its top-level code
    runs once per process, traced or not (jax's ``k8s_cluster`` draws with
    ``np.random`` as jax loads it lazily during a trace)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _in_one_step(calls: list[Callable[[], Any]]) -> Callable[[], Any]:
    """A callable that makes each of ``calls`` (C functions bound with
    ``functools.partial``) in one call of C code: no bytecode runs between
    them, so no Ctrl-C lands between them."""
    return functools.partial(collections.deque, map(operator.call, calls), 0)


def _generators_put_back(
    python_generator: Any, saved_python: Any, numpy_generator: Any, saved_numpy: Any
) -> list[Callable[[], Any]]:
    """C calls that put the global generators back to ``saved_*``:
    ``random.setstate``'s own steps (it is Python code), numpy's ``set_state``."""
    calls: list[Callable[[], Any]] = []
    if python_generator is not None:
        _, internal, gauss_next = saved_python
        calls.append(functools.partial(_random.Random.setstate, python_generator, internal))
        calls.append(functools.partial(setattr, python_generator, "gauss_next", gauss_next))
    if numpy_generator is not None:
        calls.append(functools.partial(numpy_generator.set_state, saved_numpy))
    return calls


class _Watch:
    """One active :func:`refuse_host_random_draws`: its tracing thread and
    what the drawing functions recorded for it."""

    __slots__ = ("thread", "drew", "first_draw", "unseen")

    def __init__(self, thread: int) -> None:
        self.thread = thread
        #: A draw was made on the tracing thread (recorded or not).
        self.drew = False
        self.first_draw: list[tuple[str, str | None]] = []
        #: Python numbers drawn, perhaps never used.
        self.unseen: list[tuple[str, str | None]] = []


#: The watch the drawing functions report to: ``[None]`` between traces.
#: One at a time: a watch entered while another is active (a trace inside
#: a trace; callers hold ``tracing_lock``) patches and records nothing, as
#: the outer one's wrappers, not being the generators' bound methods, were
#: never watched a second time.  Set and reset by one C call each.
_CURRENT: list[_Watch | None] = [None]


def _watching(qualified: str, original: Callable[..., Any], python_number: bool) -> Callable[..., Any]:
    """``original`` reporting its draws to the current watch (built once per
    process and function: :func:`_patches`)."""

    @functools.wraps(original)
    def draw(*args: Any, **kwargs: Any) -> Any:
        watch = _CURRENT[0]
        if watch is not None and threading.get_ident() != watch.thread:
            watch = None  # another thread's draw: not the trace's
        if watch is not None:
            watch.drew = True  # before the draw: a Ctrl-C right after it still puts the generators back
        value = original(*args, **kwargs)
        if watch is None or watch.first_draw or _importing():
            return value
        found = (qualified, innermost_on_stack())
        if python_number and type(value) in _DRAWN_TYPES:
            # A number the program may never use (MusicGen draws its
            # LayerDrop probability in eval mode too, then skips the
            # test): refused at its first use in Python; torch reads a
            # float's value without any call we could see, so one not
            # seen used is warned about.
            first_draw = watch.first_draw

            def on_use() -> None:
                if not first_draw:
                    first_draw.append(found)

            watch.unseen.append(found)
            return _DRAWN_TYPES[type(value)](value, on_use)
        watch.first_draw.append(found)
        return value

    return draw


class _Patches:
    """The watched functions of one set of sources: the C calls that put
    each wrapper in place and those that put each original back."""

    __slots__ = ("key", "originals", "patching", "unpatching")

    def __init__(self, key: tuple[Any, ...], sources: list[tuple[ModuleType, object]]) -> None:
        self.key = key
        self.originals: list[tuple[ModuleType, str, Callable[..., Any]]] = [
            (module, name, original)
            for module, generator in sources
            for name, original in _drawing_functions(module, generator)
        ]
        self.patching: list[Callable[[], Any]] = [
            functools.partial(
                setattr, module, name, _watching(f"{module.__name__}.{name}", original, module is random)
            )
            for module, name, original in self.originals
        ]
        self.unpatching: list[Callable[[], Any]] = [
            functools.partial(setattr, *entry) for entry in self.originals
        ]

    def current(self) -> bool:
        """Whether every original is still the module's attribute (no one
        replaced one since these were built)."""
        return all(getattr(module, name, None) is original for module, name, original in self.originals)


#: The last :class:`_Patches` built (~65 wrappers with numpy loaded),
#: reused by every trace while its key (the modules, their generators and
#: their attribute counts) holds and its originals are in place; else
#: built again.
_PATCHES: list[_Patches | None] = [None]


def _patches(sources: list[tuple[ModuleType, object]]) -> _Patches:
    key = tuple((module, generator, len(vars(module))) for module, generator in sources)
    cached = _PATCHES[0]
    if cached is not None and cached.key == key and cached.current():
        return cached
    built = _Patches(key, sources)
    _PATCHES[0] = built
    return built


@contextlib.contextmanager
def refuse_host_random_draws(error_type: type[TorchImportError] = TorchImportError) -> Iterator[None]:
    """See the module docstring."""
    watch = _Watch(threading.get_ident())
    numpy = sys.modules.get("numpy")
    numpy_random = getattr(numpy, "random", None) if numpy is not None else None
    numpy_generator = getattr(getattr(numpy_random, "mtrand", None), "_rand", None)
    python_generator = getattr(random, "_inst", None)
    saved_numpy = numpy_generator.get_state() if numpy_generator is not None else None
    saved_python = random.getstate()
    outermost = _CURRENT[0] is None
    patching: list[Callable[[], Any]] = []
    unwatching: list[Callable[[], Any]] = []
    if outermost:
        sources: list[tuple[ModuleType, object]] = []
        if python_generator is not None:
            sources.append((random, python_generator))
        if numpy_random is not None and numpy_generator is not None:
            sources.append((numpy_random, numpy_generator))
        patches = _patches(sources)
        patching = [functools.partial(_CURRENT.__setitem__, 0, watch), *patches.patching]
        unwatching = [*patches.unpatching, functools.partial(_CURRENT.__setitem__, 0, None)]
    # Everything is put back in one call of C code, which no Ctrl-C can
    # cut short (Python delivers signals only between bytecodes, and none
    # runs between the calls' start and the put-back); the watch is put in
    # place the same way.
    unwatch = _in_one_step(unwatching)
    unwatch_and_put_back = _in_one_step(
        unwatching + _generators_put_back(python_generator, saved_python, numpy_generator, saved_numpy)
    )
    watch_now = _in_one_step(patching)
    failed = False
    try:
        watch_now()
        yield
    except BaseException:
        failed = True
        raise
    finally:
        # A refused trace, or one cut short (Ctrl-C, an error) after a
        # draw: the caller's sequence of numbers is as it was.
        if watch.drew and (failed or watch.first_draw):
            unwatch_and_put_back()
        else:
            unwatch()
    first_draw, unseen = watch.first_draw, watch.unseen
    if not first_draw and unseen:
        function, line = unseen[0]
        warnings.warn(
            f"the program drew a random number on the host ({function})"
            + (f" at {line}" if line else "")
            + " while it was traced, and no Python code used it. If a torch op read it (`x * "
            "random.random()`), the compiled program holds the number drawn now, the same at every "
            "call: draw it with torch, or pass it in.",
            HostRandomWarning,
            stacklevel=3,
        )
    if first_draw:
        function, line = first_draw[0]
        raise error_type(
            f"the program draws random numbers on the host ({function})"
            + (f" at {line}" if line else "")
            + " while it is traced: the numbers drawn now would be constants of the compiled program, "
            "the same at every call, where eager draws new ones at each call. Draw them with torch "
            "(torch.rand, torch.randint, torch.randperm: drawn anew on the device at every call), or "
            "draw them outside the compiled function and pass them in as inputs. (transformers' "
            "Wav2Vec2 and HuBERT draw SpecAugment's masks with numpy in train mode: set "
            "config.mask_time_prob = 0 and config.mask_feature_prob = 0, or draw the mask with "
            "_compute_mask_indices outside and pass it as mask_time_indices where the model takes it.)"
        )
