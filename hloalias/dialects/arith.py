"""The ``arith`` dialect's Python module, found before torch-mlir's
generated one: intentionally empty (see :mod:`hloalias.dialects`)."""
