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
program; draws made while a module is imported (its top-level code runs
once per process, traced or not) do not count.  When the trace returns and a draw was recorded, the two global
generators are put back to their states before the trace (the caller's
sequence of numbers is as it was) and the given error type is raised,
naming the function and the line.  A trace that raises keeps its own
error.  Generators the program creates itself (``np.random.default_rng()``,
``random.Random()``) and functions imported by name before the trace
(``from numpy.random import rand``) are not watched.
"""
from __future__ import annotations

import contextlib
import functools
import random
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from hloalias.errors import TorchImportError
from hloalias.frontend.program_frames import describe_frame, is_program_file

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


def _innermost_program_line() -> str | None:
    for frame in reversed(traceback.extract_stack()):
        if is_program_file(frame.filename):
            return describe_frame(frame)
    return None


@contextlib.contextmanager
def refuse_host_random_draws(error_type: type[TorchImportError] = TorchImportError) -> Iterator[None]:
    """See the module docstring."""
    tracing_thread = threading.get_ident()
    first_draw: list[tuple[str, str | None]] = []
    watched: list[tuple[ModuleType, str, Callable[..., Any]]] = []
    numpy = sys.modules.get("numpy")
    numpy_random = getattr(numpy, "random", None) if numpy is not None else None
    numpy_generator = getattr(getattr(numpy_random, "mtrand", None), "_rand", None)
    python_generator = getattr(random, "_inst", None)
    sources: list[tuple[ModuleType, object, str]] = [(random, python_generator, "random")]
    if numpy_random is not None and numpy_generator is not None:
        sources.append((numpy_random, numpy_generator, "numpy.random"))
    saved_numpy = numpy_generator.get_state() if numpy_generator is not None else None
    saved_python = random.getstate()

    def watching(qualified: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def draw(*args: Any, **kwargs: Any) -> Any:
            if not first_draw and threading.get_ident() == tracing_thread and not _importing():
                first_draw.append((qualified, _innermost_program_line()))
            return original(*args, **kwargs)

        return draw

    for module, generator, prefix in sources:
        if generator is None:
            continue
        for name, original in _drawing_functions(module, generator):
            watched.append((module, name, original))
            setattr(module, name, watching(f"{prefix}.{name}", original))
    try:
        yield
    finally:
        for module, name, original in watched:
            setattr(module, name, original)
    if first_draw:
        random.setstate(saved_python)
        if numpy_generator is not None:
            numpy_generator.set_state(saved_numpy)
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
