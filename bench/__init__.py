"""hloalias benchmark suite: device bytes against the physical minimum,
pass time against XLA compile time, pass scaling and per-call overhead.

Run it from the repository root with ``.venv/bin/python -m bench.run``."""
