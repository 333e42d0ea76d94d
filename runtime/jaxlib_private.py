"""Every private jax/jaxlib name hloalias uses, in one place, behind a
version check.

hloalias reaches PJRT through jaxlib and uses a few of its private entries
for speed or for what the public API does not offer: the zero-copy DLPack
entries (``dlpack_managed_tensor_to_buffer``/``buffer_to_dlpack_managed_tensor``:
~3x cheaper than ``jax.dlpack``), the host-buffer copy
(``batched_device_put`` with ``HostBufferSemantics``: a small numpy value
into a PJRT-owned buffer without ``jax.device_put``'s Python layers), the C++ dispatch fast path (``pjit`` with
``MeshExecutableFastpathData``, the path ``jax.jit`` calls take), the
``xla_client`` types (``CompileOptions``, ``DeviceList``, ``HloSharding``,
``ArrayImpl``), ``GSPMDSharding``, and for several processes
``jax._src.distributed``'s coordination client (key-value store, barrier)
and ``xla_bridge.backends_are_initialized``.  They were written against
:data:`TESTED_JAXLIB` (the pinned version).  On another jaxlib every
optional entry found missing is None (its caller takes the public path:
same results, more host time); the required ones fail at import with an
ImportError that names this module and the version.  A new jaxlib is
adopted by checking these names here, and nowhere else."""

from __future__ import annotations

import warnings
from typing import Any

import jaxlib.version

#: The jaxlib these private names were checked against (the pinned one).
TESTED_JAXLIB = "0.10.2"
JAXLIB_VERSION: str = jaxlib.version.__version__

try:  # required: compile options, device lists, array and sharding types
    from jax._src import distributed as jax_distributed  # the coordination client (runtime/distributed.py)
    from jax._src import sharding_impls, xla_bridge
    from jax._src.lib import xla_client
except ImportError as error:  # pragma: no cover - another jaxlib's layout
    raise ImportError(
        f"hloalias.runtime.jaxlib_private: jaxlib {JAXLIB_VERSION} lacks {error.name}; hloalias was "
        f"checked against jaxlib {TESTED_JAXLIB}"
    ) from error

dlpack_to_buffer: Any = None
buffer_to_dlpack: Any = None
pjit: Any = None
tree_util: Any = None
pxla: Any = None
#: ``array_result_handler(aval, sharding, committed=, _skip_checks=)``: a
#: C++ result handler, so ``ExecuteResults.consume_with_handlers`` makes the
#: result arrays without calling back into Python (pjrt.SingleDeviceDispatch).
array_result_handler: Any = getattr(xla_client, "array_result_handler", None)
#: ``batched_device_put(aval, sharding, xs, devices, committed, force_copy,
#: host_buffer_semantics, enable_x64)``: numpy values copied into PJRT-owned
#: buffers (ownership.host_copy), and its semantics enum.
batched_device_put: Any = getattr(xla_client, "batched_device_put", None)
host_buffer_semantics: Any = getattr(xla_client, "HostBufferSemantics", None)
if host_buffer_semantics is None or not hasattr(host_buffer_semantics, "IMMUTABLE_ONLY_DURING_CALL"):
    batched_device_put = None
try:
    from jax._src.lib import _jax as _jaxlib_ext

    dlpack_to_buffer = getattr(_jaxlib_ext, "dlpack_managed_tensor_to_buffer", None)
    buffer_to_dlpack = getattr(_jaxlib_ext, "buffer_to_dlpack_managed_tensor", None)
    # jaxlib's C++ dispatch of a loaded executable (pjrt.SingleDeviceDispatch).
    pjit = getattr(_jaxlib_ext, "pjit", None)
except ImportError:  # a jaxlib without the extension entries: the public path
    pass
try:
    # What that dispatch's entries are built from; without them every call
    # takes execute_sharded.
    from jax._src import tree_util as _tree_util
    from jax._src.interpreters import pxla as _pxla

    tree_util, pxla = _tree_util, _pxla
    if not hasattr(pxla, "MeshExecutableFastpathData"):
        pjit = None
except ImportError:
    pjit = None

if JAXLIB_VERSION != TESTED_JAXLIB:
    missing = [
        name for name, value in (
            ("dlpack_managed_tensor_to_buffer", dlpack_to_buffer), ("buffer_to_dlpack_managed_tensor", buffer_to_dlpack),
            ("pjit fast path", pjit), ("array_result_handler", array_result_handler),
            ("batched_device_put", batched_device_put),
        ) if value is None
    ]
    warnings.warn(
        f"hloalias was checked against jaxlib {TESTED_JAXLIB}, this is {JAXLIB_VERSION}"
        + (f"; private entries missing (their public paths serve): {', '.join(missing)}" if missing else ""),
        stacklevel=2,
    )

__all__ = [
    "JAXLIB_VERSION", "TESTED_JAXLIB", "array_result_handler", "batched_device_put", "buffer_to_dlpack",
    "dlpack_to_buffer", "host_buffer_semantics", "jax_distributed", "pjit", "pxla",
    "sharding_impls", "tree_util", "xla_bridge", "xla_client",
]
