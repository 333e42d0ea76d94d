"""Build of the native call path (``hloalias.runtime._lane``, C++ against
torch's headers); everything else is declared in pyproject.toml.

torch is a build requirement (pyproject.toml's ``[build-system]``), so a
plain ``pip install .`` (or of the sdist, which carries ``runtime/_lane.cpp``)
compiles the extension in pip's isolated build environment against the
same torch the runtime pins.  ``scripts/venv.sh`` installs with
``--no-build-isolation`` instead, against the torch already in ``.venv``
(no second torch in a build environment).  When the compile fails (no C++
compiler), hloalias installs without the extension, says so here, and warns
once at run time (:func:`hloalias.config.warn_native_missing`); every call
then takes the Python path (same results, more host time per call).
``HLOALIAS_REQUIRE_NATIVE=1`` makes a failed build an error instead."""

import os
import sys

from setuptools import setup

REQUIRED = os.environ.get("HLOALIAS_REQUIRE_NATIVE") == "1"


def _native_extensions() -> tuple[list, dict]:
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        if REQUIRED:
            raise
        print("hloalias: torch is not importable at build time: no native call path", file=sys.stderr)
        return [], {}

    class OptionalBuild(BuildExtension):  # type: ignore[misc]
        def build_extension(self, ext):  # type: ignore[no-untyped-def]
            try:
                super().build_extension(ext)
            except Exception as error:  # a missing compiler, headers of another torch
                if REQUIRED:
                    raise
                print(f"hloalias: WARNING: the native call path (runtime/_lane.cpp) did not build ({error}); "
                      "hloalias installs without it and every call takes the Python path", file=sys.stderr)

    # -g0: no DWARF (Python's CFLAGS ask for -g): the library is ~0.2 MB
    # instead of ~5.6 MB, which every process reads and hashes for the
    # program cache's key (runtime/source_key.py) before its first compile.
    # Symbols stay (backtraces still name functions).
    extension = CppExtension(
        "hloalias.runtime._lane", ["runtime/_lane.cpp"], extra_compile_args=["-O2", "-std=c++17", "-g0"],
    )
    return [extension], {"build_ext": OptionalBuild.with_options(use_ninja=False)}


extensions, commands = _native_extensions()
setup(ext_modules=extensions, cmdclass=commands)
