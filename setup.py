"""Build of the native call path (``hloalias.runtime._lane``, C++ against
torch's headers); everything else is declared in pyproject.toml.

The extension needs the installed torch at build time, so install with
``pip install --no-build-isolation -e .`` after torch (``scripts/venv.sh``
does).  Without torch, or when the compile fails, hloalias installs without
it and every call takes the Python path (same results, more host time per
call); ``HLOALIAS_REQUIRE_NATIVE=1`` makes either an error instead."""

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
                print(f"hloalias: the native call path did not build ({error}); the Python path serves", file=sys.stderr)

    extension = CppExtension(
        "hloalias.runtime._lane", ["runtime/_lane.cpp"], extra_compile_args=["-O2", "-std=c++17"],
    )
    return [extension], {"build_ext": OptionalBuild.with_options(use_ninja=False)}


extensions, commands = _native_extensions()
setup(ext_modules=extensions, cmdclass=commands)
