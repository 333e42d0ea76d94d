"""The key of a compile computed from what the user handed over, before any
import: the same key in any process means the same compiled program.

:func:`source_key` returns a SHA-256 hex digest, or raises
:class:`Uncacheable` with the reason when some part cannot be keyed soundly.
What the key holds, and why (a cached program may be returned only when a
fresh ``torch.export`` and lowering would produce the same final module):

- **Versions**: Python, torch, torch-mlir, jax, jaxlib, transformers (when
  loaded), and hloalias itself as a digest of its source files and native
  extension (a changed pass changes the key).
- **The code**, printed without file names or line numbers: for a plain
  function its code object (bytecode, constants, names, nested code),
  defaults, closure cells by value and the globals it reads; for an
  ``nn.Module`` every submodule (``named_modules``, duplicates kept) with its
  name, class and ``training`` flag.  A class defined outside the
  libraries below is keyed by everything in its ``__dict__`` and those of
  its bases (methods by code, class attributes by value); a library class by
  its qualified name and the library's version.  A ``torch.fx.GraphModule``
  (the graphs ``torch.compile`` hands the ``hloalias`` backend, and
  AOTAutograd's) is keyed by the ``forward`` its graph generates (a
  function of its per-instance class: bytecode, constants and the globals
  it reads, such as a library function it calls); a lazy graph module
  generates it first.  Its graph object, code text, ``meta`` and dynamo's
  report fields are not keyed: the generated ``forward`` is what runs, and
  reads none of them.  Code's globals (for user
  code, three calls deep) are keyed by value: scalars, containers,
  tensors (with their bytes: forward may bake a global tensor in), dtypes,
  functions by code, classes as above, a user module by the digest of its
  source file.
- **Configuration values the code reads**: every attribute of every
  submodule other than torch's own bookkeeping, by value, recursively
  through plain objects (a ``transformers`` config is keyed by all its
  fields); an object shared by several modules is printed once.
- **State metadata**, not values (values are arguments of the program):
  every parameter, buffer and tensor attribute by name with shape, dtype,
  strides, storage offset, ``requires_grad``, whether it is persistent,
  and which tensors share a storage (tied weights merge at import).
- **The inputs**: the pytree structure of ``(args, kwargs)``; per tensor
  leaf its shape, dtype, strides, ``requires_grad`` and storage sharing
  with other leaves; other leaves (static values) by value.
- **Options and settings**: whatever the caller passes as ``options``
  (donation, pipeline, device), grad mode and the default dtype.

Uncacheable (the caller takes the full import path and says why): an
``ExportedProgram``; a module with forward hooks or pre-hooks, or global
module hooks; a value of a type with no printable state (an open file, a
C object, a lambda from a library passed as a value); cycles or nesting
deeper than ``_MAX_DEPTH``; user code reached more than three calls deep;
user code that reads the process environment (``os.environ``,
``os.getenv``): forward may bake a variable's value in.

Not seen (documented limits): globals read by *library* code (a registry
inside ``transformers`` changed at run time), functions reached other than
by a global name or attribute of ``self`` (a user module's function called
as ``module.fn`` is covered by that module's file digest, not its run-time
globals), and library files edited in place without a version change."""

from __future__ import annotations

import abc
import dataclasses
import enum
import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import sys
import sysconfig
import types
from typing import Any

import torch
import torch.utils._pytree as pytree
from hloalias.config import memo_cache_size
from hloalias.lru import memoized
from hloalias.runtime.state import fresh_type, user_forward_pre_hooks

_MAX_DEPTH = 24  # nesting of values
_MAX_CALL_DEPTH = 3  # user functions followed through globals
_LIBRARIES = frozenset({
    "torch", "torch_mlir", "transformers", "jax", "jaxlib", "numpy", "hloalias", "functools", "typing",
    "collections", "math", "operator", "builtins", "abc", "enum", "dataclasses", "itertools", "inspect",
    "contextlib", "warnings", "copy", "types", "re", "einops", "safetensors", "tokenizers", "huggingface_hub",
})
_SCALARS = (bool, int, float, complex, str, bytes, type(None))
# What user code may read of the process rather than of the program: a
# program that reads ``os.environ`` bakes the value it saw, and the library's
# version says nothing of it.  Keying the whole environment would miss in every
# new shell, so such a compile takes the full path.
_PROCESS_ENVIRONMENT = frozenset({"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"})
# Object fields that differ between processes and that no forward reads:
# transformers' PretrainedConfig records ``hash(self)`` at construction.
_PROCESS_LOCAL_FIELDS = frozenset({"_original_object_hash"})


class Uncacheable(Exception):
    """The key cannot be computed soundly; ``str(error)`` says why."""


@functools.cache
def _nn_module_bookkeeping() -> frozenset[str]:
    """Attribute names every ``nn.Module`` holds for torch itself (hooks,
    the parameter/buffer/module tables): not configuration."""
    return frozenset(torch.nn.Module().__dict__)


#: What dynamo sets on the ``GraphModule`` it hands a backend, for its own
#: reports (where each parameter came from, the user's stack, why the graph
#: ended): its generated ``forward`` never reads them.
_DYNAMO_GRAPH_BOOKKEEPING = frozenset({"_param_name_to_source", "_source_to_user_stacks", "compile_subgraph_reason"})


@functools.cache
def _graph_module_bookkeeping() -> frozenset[str]:
    """Attribute names a ``torch.fx.GraphModule`` holds besides an
    ``nn.Module``'s: the graph (``_graph``, whose ``_find_nodes_lookup_table``
    holds C objects no key can print), its generated code's text and line
    map, the tracer it was made by, graph-editing hooks, ``meta`` and the
    ``shape_env``.  A graph module runs its generated ``forward`` only, which
    is keyed by its code (:meth:`_Printer.module`); none of these is read by
    it.  Found from an empty graph module, eager and lazy, so that a field a
    later torch adds is found too."""
    from torch.fx._lazy_graph_module import _LazyGraphModule

    names: set[str] = set(_DYNAMO_GRAPH_BOOKKEEPING)
    for kind in (torch.fx.GraphModule, _LazyGraphModule):
        names |= set(kind(torch.nn.Module(), torch.fx.Graph()).__dict__)
    return frozenset(names - _nn_module_bookkeeping())


def _library_of(module_name: str | None) -> str | None:
    top = (module_name or "").split(".")[0]
    if top in _LIBRARIES or top in sys.stdlib_module_names:
        return top
    return None


def _library_definition(value: Any) -> str | None:
    """The library that defines the class or function ``value`` (see
    ``_LIBRARIES``), or None.  Only a definition its module holds under its
    qualified name counts: a class or function made by ``exec`` without a
    ``__name__`` says it is from ``builtins``, and a local one from a
    library's function is made at run time; both are keyed by their code."""
    library = _library_of(getattr(value, "__module__", None))
    if library is None:
        return None
    if isinstance(value, types.FunctionType):  # decorated library functions too: by their file
        return library if _in_library_files(value.__code__.co_filename, library) else None
    qualname = getattr(value, "__qualname__", "")
    if "<locals>" in qualname:
        return None
    found: Any = sys.modules.get(value.__module__)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return library if found is value else None


def _in_library_files(path: str, library: str) -> bool:
    if library in sys.stdlib_module_names or library == "builtins":
        root = sysconfig.get_paths()["stdlib"]
    else:
        module = sys.modules.get(library)
        location = getattr(module, "__file__", None)
        if not location:
            return False
        root = os.path.dirname(os.path.abspath(location))
    return os.path.abspath(path).startswith(root + os.sep)


@functools.cache
def _distribution_version(top: str) -> str:
    if top in sys.stdlib_module_names or top == "builtins":
        return sys.version
    if top == "hloalias":
        return own_code_digest()
    names = {"torch_mlir": "torch-mlir", "huggingface_hub": "huggingface-hub"}
    name = names.get(top, top)
    found = _version_beside(sys.modules.get(top), name)
    if found is not None:
        return found
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        module = sys.modules.get(top)
        return str(getattr(module, "__version__", "unknown"))


def _version_beside(module: Any, name: str) -> str | None:
    """The ``Version`` field of distribution ``name``'s ``.dist-info``
    folder beside the imported ``module`` (the folder a wheel installs it
    in), read from the METADATA file's header lines; None when there is no
    single such folder (an editable install, an egg), and the caller asks
    ``importlib.metadata``.  That finds the same field, but its first call
    in a process indexes every folder on ``sys.path`` and it parses the
    whole METADATA file (~5 ms of a cold compile); this is one directory
    listing and a few lines.  It is the version of the code that runs:
    where two copies are installed, the one imported."""
    if module is None:
        return None
    locations = list(getattr(module, "__path__", None) or ())  # a package, namespace packages too
    if not locations and getattr(module, "__file__", None):
        locations = [os.path.dirname(module.__file__)]
    wanted = _normalized_distribution(name)
    folders = {os.path.dirname(os.path.abspath(location)) for location in locations}
    matches = []
    for folder in sorted(folders):
        try:
            entries = os.listdir(folder)
        except OSError:
            continue
        matches += [os.path.join(folder, entry) for entry in entries if entry.endswith(".dist-info")
                    and _normalized_distribution(entry[:-len(".dist-info")].split("-")[0]) == wanted]
    if len(matches) != 1:
        return None
    try:
        with open(os.path.join(matches[0], "METADATA"), encoding="utf-8") as handle:
            for line in handle:
                if not line.strip():  # the end of the header lines
                    break
                if line.startswith("Version:"):
                    return line[len("Version:"):].strip() or None
    except (OSError, UnicodeDecodeError):
        return None
    return None


def _normalized_distribution(name: str) -> str:
    """A distribution name as wheels spell it in folder names (PEP 503's
    normalization, ``_`` for the separators)."""
    return re.sub(r"[-_.]+", "_", name).lower()


@functools.cache
def versions() -> tuple[str, ...]:
    """The versions every key holds (transformers only once loaded), and a
    digest of hloalias's own code: a version number does not change with
    every build (an editable install, a pip install from a git commit), and
    an entry compiled by other lowerings or passes must not be found."""
    parts = [f"python={sys.version}", f"torch={torch.__version__}"]
    for top in ("torch_mlir", "jax", "jaxlib"):
        parts.append(f"{top}={_distribution_version(top)}")
    parts.append(f"hloalias={own_code_digest()}")
    return tuple(parts)


#: The packages whose code makes the program: every layer of hloalias.
_OWN_PACKAGES = ("hloalias", "hloalias.frontend", "hloalias.passes", "hloalias.pipeline", "hloalias.runtime")


def own_code_digest() -> str:
    """A digest of every Python file and native extension of hloalias's
    layers (names and contents; found without importing the layers, which
    is what the cache before import saves).  See :func:`_code_digest`."""
    return _code_digest(_own_code_files())


def _own_code_files() -> list[tuple[str, str, str]]:
    """``(package, path relative to its folder, path)`` of every file
    :func:`own_code_digest` covers, in a fixed order."""
    found = []
    for package in _OWN_PACKAGES:
        spec = importlib.util.find_spec(package)
        for root in (spec.submodule_search_locations or ()) if spec is not None else ():
            for folder, subfolders, files in os.walk(root):
                subfolders[:] = sorted(name for name in subfolders if name != "__pycache__")
                for name in sorted(files):
                    if name.endswith((".py", ".so", ".pyd")):
                        path = os.path.join(folder, name)
                        found.append((package, os.path.relpath(path, root), path))
    return found


#: The disk cache's file suffix of a stored code digest (:func:`_code_digest`).
CODE_DIGEST_SUFFIX = ".code"


def _code_digest(files: list[tuple[str, str, str]]) -> str:
    """SHA-256 over the names and contents of ``files`` (``(package,
    relative path, path)``).

    Reading and hashing every file (~1.4 MB) is done once per set of file
    versions, not once per process: the digest is stored beside the disk
    cache's key (an authenticated per-user entry,
    :func:`hloalias.runtime.disk_cache.read_beside_key`) for a key made of
    each file's name and ``os.stat`` signature (size,
    modification and change times in ns, inode, device).  Any write to a
    file gives it a new change time, which no user tool can set back
    (``cp -p``, ``touch -d`` and a checkout preserve or set the
    modification time only), so a signature seen again means the same
    contents: the stored digest is the one the contents give.  Python's
    own import trusts less (a ``.pyc`` is valid for a source of the same
    size and modification second).  Without a usable disk cache
    (``HLOALIAS_CACHE=0``, an untrusted directory) the files are read."""
    stat_key = _signatures_key(files)
    from hloalias.runtime import disk_cache  # loads jax: not at this module's import

    # One entry per set of folders (an installation), beside the cache's key:
    # not per cache directory, as the digest is not per program.
    name = "code-" + hashlib.sha256("\0".join(sorted({path for _, _, path in files})).encode()).hexdigest()[:16]
    stored = disk_cache.read_beside_key(name, stat_key, CODE_DIGEST_SUFFIX)
    if stored is not None and re.fullmatch(rb"[0-9a-f]{64}", stored):
        return stored.decode()
    digest = hashlib.sha256()
    for package, relative, path in files:
        digest.update(f"{package}:{relative}\0{_file_digest(path)}\0".encode())
    found = digest.hexdigest()
    # Stored only when no file changed while it was read: the contents
    # hashed are then the ones the signatures describe.
    if _signatures_key(files) == stat_key:
        disk_cache.write_beside_key(name, stat_key, CODE_DIGEST_SUFFIX, found.encode())
    return found


def _signatures_key(files: list[tuple[str, str, str]]) -> str:
    signatures = hashlib.sha256()
    for package, relative, path in files:
        signatures.update(f"{package}:{relative}\0{_file_signature(path)}\0".encode())
    return signatures.hexdigest()


def _file_signature(path: str) -> str:
    """What changes whenever ``path``'s contents do (see :func:`_code_digest`)."""
    try:
        info = os.stat(path)
    except OSError:
        return "missing"
    return f"{info.st_size} {info.st_mtime_ns} {info.st_ctime_ns} {info.st_ino} {info.st_dev}"


def _file_digest(path: str) -> str:
    info = os.stat(path)
    return _file_digest_cached(path, info.st_size, info.st_mtime_ns)


# Bounded by HLOALIAS_MEMO_CACHE_SIZE: one entry per source file of the
# programs keyed and per edit of one (its size and mtime are the key).
@memoized(memo_cache_size)
def _file_digest_cached(path: str, size: int, mtime_ns: int) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


class _Printer:
    """Prints values into nested tuples of plain Python values (the same
    in every process for the same program)."""

    def __init__(self) -> None:
        self.shared: dict[int, int] = {}  # id of an object printed already -> its number
        self.keep: list[Any] = []  # keeps the objects numbered above alive while printing
        self.storages: dict[int, int] = {}  # storage address -> first tensor's number
        self.active: set[int] = set()

    # -- values ------------------------------------------------------------
    def value(self, value: Any, where: str, depth: int = 0) -> Any:
        if depth > _MAX_DEPTH:
            raise Uncacheable(f"{where} is nested more than {_MAX_DEPTH} levels deep")
        if isinstance(value, _SCALARS):
            return (type(value).__name__, value)
        if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
            return (type(value).__name__, str(value))
        if isinstance(value, torch.Tensor):
            return self.tensor(value, where, with_values=True)
        if isinstance(value, enum.Enum):
            return ("enum", self.cls(type(value), where), value.name)
        if isinstance(value, (types.FunctionType, types.MethodType, functools.partial, types.BuiltinFunctionType,
                              type, types.ModuleType, torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            return self.code_value(value, where, 0)
        ident = id(value)
        if ident in self.shared:
            return ("same-as", self.shared[ident])
        if ident in self.active:
            raise Uncacheable(f"{where} refers to itself")
        self.active.add(ident)
        try:
            printed = self._container(value, where, depth)
        finally:
            self.active.discard(ident)
        self.shared[ident] = len(self.shared)
        self.keep.append(value)
        return printed

    def _container(self, value: Any, where: str, depth: int) -> Any:
        if isinstance(value, (tuple, list)):
            return (type(value).__name__, tuple(self.value(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)))
        if isinstance(value, dict):
            items = [(self.value(k, f"a key of {where}", depth + 1), self.value(v, f"{where}[{k!r}]", depth + 1))
                     for k, v in value.items()]
            return ("dict", tuple(items))  # insertion order: code may iterate it
        if isinstance(value, (set, frozenset)):
            return (type(value).__name__, tuple(sorted(repr(self.value(v, where, depth + 1)) for v in value)))
        if isinstance(value, torch.nn.Module):
            raise Uncacheable(f"{where} is a module that is not a submodule")
        if dataclasses.is_dataclass(value) or _plain_object(value):
            fields = vars(value) if hasattr(value, "__dict__") else {
                f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
            return ("object", self.cls(type(value), where),
                    tuple((name, self.value(v, f"{where}.{name}", depth + 1)) for name, v in sorted(fields.items())
                          if name not in _PROCESS_LOCAL_FIELDS))
        raise Uncacheable(f"{where} is a {type(value).__module__}.{type(value).__qualname__}, "
                          "a value the compile key cannot print")

    def tensor(self, tensor: torch.Tensor, where: str, with_values: bool) -> Any:
        # A tensor calls left stale (runtime/state.py) keys as its own class.
        if fresh_type(tensor) not in (torch.Tensor, torch.nn.Parameter, torch.nn.Buffer):
            raise Uncacheable(f"{where} is a tensor subclass ({type(tensor).__name__})")
        if tensor.is_sparse or tensor.is_quantized or tensor.is_nested or tensor.device.type == "meta":
            raise Uncacheable(f"{where} is a {tensor.layout} / {tensor.device} tensor")
        storage = tensor.untyped_storage().data_ptr()
        shared = self.storages.setdefault(storage, len(self.storages))
        printed: tuple[Any, ...] = (
            type(tensor).__name__, tuple(tensor.shape), str(tensor.dtype), tuple(tensor.stride()),
            tensor.storage_offset(), tensor.requires_grad, str(tensor.device), shared,
            tensor.is_conj(), tensor.is_neg(),
        )
        if with_values:
            data = tensor.detach().contiguous().cpu()
            raw = data.reshape(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b""
            printed += (hashlib.sha256(raw).hexdigest(),)
        return printed

    # -- code --------------------------------------------------------------
    def code_value(self, value: Any, where: str, calls: int) -> Any:
        if isinstance(value, types.ModuleType):
            library = _library_of(value.__name__)
            if library is not None:
                return ("module", value.__name__, _distribution_version(library))
            path = getattr(value, "__file__", None)
            if not path or not os.path.exists(path):
                raise Uncacheable(f"{where} is module {value.__name__} without a source file")
            return ("module", value.__name__, _file_digest(path))
        if isinstance(value, type):
            return self.cls(value, where)
        if isinstance(value, functools.partial):
            return ("partial", self.code_value(value.func, where, calls),
                    self.value(value.args, f"{where}'s arguments"), self.value(value.keywords, f"{where}'s keywords"))
        if isinstance(value, types.MethodType):
            return ("method", self.code_value(value.__func__, where, calls), self.value(value.__self__, f"{where}'s self"))
        if isinstance(value, types.FunctionType):
            return self.function(value, where, calls)
        if isinstance(value, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            return ("op", str(value))
        # builtins (len, math.sqrt, torch.add): identified by name and library version
        module = getattr(value, "__module__", None) or getattr(getattr(value, "__self__", None), "__name__", None)
        library = _library_of(module) or ("torch" if module is None and "torch" in repr(value) else None)
        name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
        if library is None or name is None:
            raise Uncacheable(f"{where} is {value!r}, a callable the compile key cannot print")
        return ("builtin", module, name, _distribution_version(library))

    def function(self, fn: types.FunctionType, where: str, calls: int) -> Any:
        library = _library_definition(fn)
        if library is not None:
            return ("function", fn.__module__, fn.__qualname__, _distribution_version(library))
        if calls > _MAX_CALL_DEPTH:
            raise Uncacheable(f"{where} ({fn.__qualname__}) is user code more than {_MAX_CALL_DEPTH} calls deep")
        ident = id(fn)
        if ident in self.shared:
            return ("same-as", self.shared[ident])
        self.shared[ident] = len(self.shared)
        self.keep.append(fn)
        name = f"{fn.__module__}.{fn.__qualname__}"
        cells = tuple(self.value(_cell(cell, name), f"a closure variable of {name}")
                      for cell in (fn.__closure__ or ()))
        return (
            "function", fn.__module__, fn.__qualname__, _code(fn.__code__),
            self.value(fn.__defaults__, f"the defaults of {name}"),
            self.value(fn.__kwdefaults__, f"the keyword defaults of {name}"),
            cells, self.globals_read(fn.__code__, fn.__globals__, name, calls),
        )

    def globals_read(self, code: types.CodeType, namespace: dict[str, Any], name: str, calls: int) -> Any:
        parts = []
        for global_name in sorted(_names(code)):
            if global_name not in namespace:
                continue  # a builtin, an attribute name, or not defined yet
            value = namespace[global_name]
            where = f"global '{global_name}' read by {name}"
            _refuse_environment_reads(value, code, where)
            if isinstance(value, types.FunctionType):
                parts.append((global_name, self.function(value, where, calls + 1)))
            elif isinstance(value, (type, types.ModuleType, types.BuiltinFunctionType, functools.partial)):
                parts.append((global_name, self.code_value(value, where, calls + 1)))
            else:
                parts.append((global_name, self.value(value, where)))
        return tuple(parts)

    def cls(self, cls: type, where: str) -> Any:
        library = _library_definition(cls)
        if library is not None:
            return ("class", cls.__module__, cls.__qualname__, _distribution_version(library))
        ident = id(cls)
        if ident in self.shared:
            return ("same-as", self.shared[ident])
        self.shared[ident] = len(self.shared)
        self.keep.append(cls)
        name = f"{cls.__module__}.{cls.__qualname__}"
        bases = tuple(self.cls(base, f"a base of {name}") for base in cls.__bases__)
        members: list[Any] = []
        for member, value in sorted(cls.__dict__.items()):
            if member in ("__dict__", "__weakref__", "__doc__", "__module__", "__qualname__",
                          "__annotations__", "__parameters__", "__orig_bases__", "__static_attributes__",
                          "__firstlineno__", "_is_protocol", "__abstractmethods__", "_abc_impl",
                          # a dataclass's field descriptions: its generated methods
                          # (above, by code) and its instances' values say the rest
                          "__dataclass_fields__", "__dataclass_params__"):
                continue
            what = f"{name}.{member}"
            if isinstance(value, (staticmethod, classmethod)):
                members.append((member, type(value).__name__, self.code_value(value.__func__, what, 1)))
            elif isinstance(value, property):
                members.append((member, "property", *(self.code_value(f, what, 1) if f is not None else None
                                                      for f in (value.fget, value.fset, value.fdel))))
            elif isinstance(value, functools.cached_property):
                members.append((member, "cached_property", self.code_value(value.func, what, 1)))
            elif isinstance(value, (types.FunctionType, type)):
                members.append((member, self.code_value(value, what, 1)))
            else:
                members.append((member, self.value(value, what)))
        return ("class", name, bases, tuple(members))

    # -- modules -------------------------------------------------------------
    def module(self, root: torch.nn.Module) -> Any:
        if (torch.nn.modules.module._global_forward_hooks or torch.nn.modules.module._global_forward_pre_hooks
                or getattr(torch.nn.modules.module, "_global_forward_hooks_always_called", None)):
            raise Uncacheable("global module forward hooks are registered")
        bookkeeping = _nn_module_bookkeeping()
        parts: list[Any] = []
        for name, sub in root.named_modules(remove_duplicate=False):
            where = f"module '{name or type(root).__name__}'"
            if sub._forward_hooks or user_forward_pre_hooks(sub):
                raise Uncacheable(f"{where} has forward hooks")
            skipped = bookkeeping
            if isinstance(sub, torch.fx.GraphModule):
                # A graph module (dynamo's, AOTAutograd's) runs the forward
                # its graph generates, a function of its class (keyed by
                # code below): a lazy one generates it on first use, here.
                sub.code  # noqa: B018  (the property generates forward)
                skipped = bookkeeping | _graph_module_bookkeeping()
            own_forward = sub.__dict__.get("forward")
            parts.append((
                name, self.cls(type(sub), where), sub.training,
                None if own_forward is None else self.code_value(own_forward, f"{where}.forward", 1),
            ))
            for table in ("_parameters", "_buffers"):
                for tensor_name, tensor in sub.__dict__[table].items():
                    persistent = tensor_name not in sub._non_persistent_buffers_set
                    parts.append((table, tensor_name, persistent,
                                  None if tensor is None else self.tensor(tensor, f"{where}.{tensor_name}", False)))
            for attr, value in sorted(sub.__dict__.items()):
                if attr in skipped or attr in ("forward", "__reduce_ex__"):  # the state group's (runtime/state.py)
                    continue
                what = f"attribute '{attr}' of {where}"
                if isinstance(value, torch.Tensor):  # an argument of the program (a lifted constant)
                    parts.append((attr, self.tensor(value, what, False)))
                else:
                    parts.append((attr, self.value(value, what)))
        return tuple(parts)


def _refuse_environment_reads(value: Any, code: types.CodeType, where: str) -> None:
    """Raise :class:`Uncacheable` when ``value``, a global of ``code``, is the
    process environment or the ``os`` module that ``code`` reads it through."""
    if value is os and _PROCESS_ENVIRONMENT & _names(code):
        reads = ", ".join(sorted(_PROCESS_ENVIRONMENT & _names(code)))
        raise Uncacheable(f"{where} reads the process environment (os.{reads}), whose values the key does not hold")
    if any(value is getattr(os, attribute, None) for attribute in _PROCESS_ENVIRONMENT):
        raise Uncacheable(f"{where} is the process environment, whose values the key does not hold")


def _plain_object(value: Any) -> bool:
    """An instance of an ordinary Python class whose state is its
    ``__dict__`` (no slots, not a C type)."""
    cls = type(value)
    return (type(cls) in (type, abc.ABCMeta) and cls.__module__ != "builtins"
            and isinstance(getattr(value, "__dict__", None), dict))


def _cell(cell: Any, name: str) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # not bound yet: a recursive inner function
        raise Uncacheable(f"a closure variable of {name} is unbound") from None


def _names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _names(constant)
    return names


def _code(code: types.CodeType) -> Any:
    """A code object's meaning, without its file name and line numbers."""
    return (
        code.co_name, code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags,
        code.co_code.hex(), tuple(_constant(c) for c in code.co_consts),
        code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars,
    )


def _constant(constant: Any) -> Any:
    if isinstance(constant, types.CodeType):
        return _code(constant)
    if isinstance(constant, frozenset):  # its repr's order depends on string hashing
        return ("frozenset", tuple(sorted(repr(_constant(c)) for c in constant)))
    if isinstance(constant, tuple):
        return ("tuple", tuple(_constant(c) for c in constant))
    return (type(constant).__name__, repr(constant))


def source_key(
    f: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: Any, program: Any = None
) -> str:
    """The key of compiling ``f`` on ``(args, kwargs)`` with ``options`` (a
    value of plain Python types); :class:`Uncacheable` with the reason when
    some part cannot be printed (see the module docstring).

    ``program``: the printing of ``f`` that :func:`keyed_source` returned
    for ``f`` in the same state (no code ran in between that could change
    it: the caller's word), used instead of printing ``f`` again; only for
    a key without inputs (an input's printing numbers its storage after
    the state's, which the printing alone does not carry)."""
    return keyed_source(f, args, kwargs, options, program)[0]


def keyed_source(
    f: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: Any, program: Any = None
) -> tuple[str, Any]:
    """:func:`source_key` and the printing of ``f`` it holds (the costly
    part: every submodule, its code and configuration), for a later key of
    the same object in the same state (``program``)."""
    from torch.export import ExportedProgram

    printer = _Printer()
    if isinstance(f, ExportedProgram):
        raise Uncacheable("an ExportedProgram is keyed by identity only (import it again per process)")
    leaves, spec = pytree.tree_flatten((args, kwargs))
    if program is not None:
        if leaves:
            raise ValueError("a printing of the program is reused only for a key without inputs")
    elif isinstance(f, torch.nn.Module):
        program = ("module", printer.module(f))
    elif isinstance(f, (types.FunctionType, functools.partial, types.MethodType)):
        program = ("function", printer.code_value(f, "the compiled function", 0))
    else:
        raise Uncacheable(f"the compiled object is a {type(f).__name__}")
    inputs = tuple(
        printer.tensor(leaf, f"input {i}", False) if isinstance(leaf, torch.Tensor)
        else printer.value(leaf, f"input {i}")
        for i, leaf in enumerate(leaves)
    )
    settings = (torch.is_grad_enabled(), str(torch.get_default_dtype()))
    library_versions = versions()
    if "transformers" in sys.modules:
        library_versions += (f"transformers={_distribution_version('transformers')}",)
    printed = (library_versions, program, str(spec), inputs, settings, options)
    return hashlib.sha256(repr(printed).encode()).hexdigest(), program

