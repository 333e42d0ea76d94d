"""The main job: the program from the torch_xla bug this project answers,
run through import -> hloalias passes -> PJRT (CPU), next to the same
program without hloalias's passes, printing the device bytes XLA allocated.

Run with ``python -m hloalias.tools.example`` (``scripts/example.sh``)."""

from __future__ import annotations

import torch

import hloalias


def seed_program(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x``, and a reshape of a full slice of ``x``: both views in PyTorch."""
    a = x[0:1024]
    return x, a.view(2, 512)


def main() -> int:
    """Compile and run the seed program both ways; exit 1 if results differ."""
    x = torch.randn(1024)
    plain = hloalias.compile(seed_program, (x,), pipeline="builtin.module(canonicalize)")
    ours = hloalias.compile(seed_program, (x,))
    expected = seed_program(x)
    got = ours(x)
    same_values = all(torch.equal(e, g) for e, g in zip(expected, got))
    shares_storage = got[0] is x and got[1].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    print("program: x[0:1024].view(2, 512), returning x too (x: 1024 x f32 = 4096 bytes)")
    print(f"plain torch-mlir -> PJRT : {plain.memory_stats['total_bytes']:>6} bytes")
    print(f"hloalias                 : {ours.memory_stats['total_bytes']:>6} bytes (minimum: 4096)")
    print(f"results equal eager PyTorch: {same_values}; views share x's storage: {shares_storage}")
    print(ours.explain())
    return 0 if same_values and shares_storage else 1


if __name__ == "__main__":
    raise SystemExit(main())
