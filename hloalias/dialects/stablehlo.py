"""The ``stablehlo`` dialect's Python module: intentionally empty (see
:mod:`hloalias.dialects`)."""
