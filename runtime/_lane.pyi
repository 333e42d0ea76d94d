"""Type stub of the native call path (runtime/_lane.cpp)."""

from typing import Any

#: The lane's interface number (runtime/lane.py checks it; see _lane.cpp).
ABI_VERSION: int

class Lane:
    """One executable's native call path: ``lane(user_inputs)`` returns the
    call's outputs, or the ``fallback`` object given at construction when
    the call is left to the Python path (nothing was changed)."""

    def __init__(self, *args: Any) -> None: ...
    def __call__(self, user_inputs: Any, /) -> Any: ...
    @property
    def counts(self) -> dict[str, int]: ...

def first_changed(refs: tuple[Any, ...], versions: tuple[int, ...], pointers: tuple[int, ...], /) -> int:
    """The index of the first live tensor whose version or data pointer
    differs from the given ones, or -1 (runtime/state.py's StateWatch)."""

def first_differing(refs: tuple[Any, ...], snapshots: tuple[Any, ...], /) -> int:
    """The index of the first live tensor whose bytes differ from its
    snapshot's, or -1 (runtime/state.py's StateWatch)."""

def values_in_range(tensor: Any, low: int, high: int, /) -> bool | None:
    """Whether every element of a dense CPU tensor of a signed integer dtype
    lies in [low, high); None for another tensor (runtime/plan.py's _IndexCheck)."""

def wait_ready(arrays: Any, spin_ns: int, /) -> bool:
    """hloalias.runtime.pjrt.wait_ready in native code."""

class Waiter:
    """SingleDeviceDispatch's wait policy in native code:
    ``waiter(results)`` returns once every result is ready."""

    def __init__(self, spin_ns: int, /) -> None: ...
    def __call__(self, results: Any, /) -> None: ...
    @property
    def polling(self) -> bool: ...
