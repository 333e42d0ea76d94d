"""A causal language model's shape, small: what the static single trace
once declined (``test_fx_export.py``, ``test_static_single_trace.py``)."""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree

class _Cached:
    """An output object registered as a pytree node, as transformers
    registers its caches before an export."""

    def __init__(self, keys: list[torch.Tensor]) -> None:
        self.keys = keys


torch.utils._pytree.register_pytree_node(
    _Cached, lambda cached: (cached.keys, None), lambda keys, _: _Cached(list(keys)),
    serialized_type_name=f"{__name__}._Cached",
)


class CacheAndMadeConstants(torch.nn.Module):
    """A causal LM's shape: an output object (a cache), tensors made in
    ``forward`` (export lifts them as constants, named after the module
    that made them), a tied head, dropout out of training."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.inner = torch.nn.Linear(8, 8)
        self.drop = torch.nn.Dropout(0.1)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> dict[str, Any]:
        h = self.drop(self.inner(self.embed(tokens)))
        empty = torch.tensor([])  # what a DynamicLayer makes before its first update
        keys = torch.cat([empty.reshape(0, h.shape[-1]), h[0]]) * torch.tensor(2.0)
        return {"logits": torch.nn.functional.dropout(self.head(h), 0.2, training=False),
                "cache": _Cached([keys, h])}

