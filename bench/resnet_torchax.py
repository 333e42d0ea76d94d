"""torchax's XLA bytes for the ResNet-18-shaped row of bench/RESULTS-temp.md.

Runs inside the torchax peer environment (``bench/peers_setup.sh``: torch
2.9, torchax, jax 0.10.2), which has no ``transformers``: the network is
written out here with HF ``ResNetModel``'s basic layers and shapes (stem
7x7/2 + BatchNorm + ReLU + 3x3/2 max-pool, four stages of two basic blocks,
64-512 channels, 1x1 shortcut convolutions where the shape changes,
adaptive average pool; outputs ``last_hidden_state`` and ``pooler_output``),
eval mode, batch 2, 224x224, random weights.  Prints XLA's compiled memory
statistics of the function torchax jits (``torchax.compile``'s path: module
state as arguments, nothing donated).

    /work/peers/torchax-venv/bin/python bench/resnet_torchax.py
"""

from __future__ import annotations

import json

import torch
from torch import nn


class Basic(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.shortcut = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if cin != cout or stride != 1 else nn.Identity()
        )
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(y + self.shortcut(x))


class ResNet18Shape(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        blocks = []
        cin = 64
        for index, cout in enumerate((64, 128, 256, 512)):
            blocks += [Basic(cin, cout, 1 if index == 0 else 2), Basic(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.blocks(self.stem(x))
        return hidden, self.pool(hidden)


def main() -> None:
    import jax
    import torchax
    from torchax import interop

    torch.manual_seed(3)
    model = ResNet18Shape().eval()
    pixels = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        expected = model(pixels)
    env = torchax.default_env()
    with env:
        module = model.to("jax")
        args = [pixels.to("jax")]
    jittable = interop.JittableModule(module)

    def inner(params: object, buffers: object, x: object) -> object:
        return jittable.functional_call("forward", params, buffers, x)

    jitted = jax.jit(interop.jax_view(inner))
    lowered = interop.jax_view((jittable.params, jittable.buffers, *args))
    with env, torch.device("jax"), torch.no_grad():
        compiled = jitted.lower(*lowered).compile()
        hidden, pooled = compiled(*lowered)
    torch.testing.assert_close(torch.from_numpy(jax.device_get(pooled).copy()), expected[1], rtol=1e-4, atol=1e-4)
    stats = compiled.memory_analysis()
    argument, output, alias, temp = (stats.argument_size_in_bytes, stats.output_size_in_bytes,
                                     stats.alias_size_in_bytes, stats.temp_size_in_bytes)
    print(json.dumps({"torchax": getattr(torchax, "__version__", "?"), "jax": jax.__version__,
                      "argument": argument, "output": output, "alias": alias, "temp": temp,
                      "total": argument + output - alias + temp}))


if __name__ == "__main__":
    main()
