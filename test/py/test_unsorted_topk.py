"""``torch.topk(..., sorted=False)``, which mixture-of-experts routers use
(DeepSeek-V3 picks its expert groups and experts unsorted): torch-mlir
lowers only the sorted form, so the import failed.  It is now the sorted
``topk`` (frontend/decompositions.py): torch leaves the unsorted order
unspecified, and what the order does not change (the selected elements,
scatters and gathers by the indices, sums) equals eager's, forward and in
training."""

from __future__ import annotations

import copy

import pytest
import torch

import hloalias


class _Router(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(6, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = self.gate(x).softmax(-1)
        weights, chosen = torch.topk(scores, 3, dim=-1, sorted=False)
        dense = torch.zeros_like(scores).scatter(-1, chosen, weights)
        return dense, weights.sum(-1)


_X = torch.randn(5, 6, generator=torch.Generator().manual_seed(0))


def test_unsorted_topk_forward_equals_eager() -> None:
    torch.manual_seed(0)
    router = _Router()
    got = hloalias.compile(router, (_X,))(_X)
    expected = router(_X)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b.detach())


def test_unsorted_topk_trains_as_eager() -> None:
    torch.manual_seed(0)
    router = _Router()
    eager = copy.deepcopy(router)

    def step_of(m: torch.nn.Module, opt: torch.optim.Optimizer):  # type: ignore[no-untyped-def]
        def step(x: torch.Tensor) -> torch.Tensor:
            dense, total = m(x)
            loss = (dense * torch.arange(8.0)).sum() + total.sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        return step

    opt, eager_opt = (torch.optim.SGD(m.parameters(), lr=0.5) for m in (router, eager))
    train = hloalias.compile_training_step(step_of(router, opt), router, opt, (_X,))
    eager_step = step_of(eager, eager_opt)
    for _ in range(2):
        torch.testing.assert_close(train(_X), eager_step(_X).detach(), rtol=1e-5, atol=1e-6)
    for a, b in zip(router.parameters(), eager.parameters()):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)


def test_deepseek_v3_routing_equals_eager() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.DeepseekV3Config(
        vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        intermediate_size=32, moe_intermediate_size=8, n_routed_experts=4, num_experts_per_tok=2, n_group=2,
        topk_group=1, first_k_dense_replace=1, kv_lora_rank=8, q_lora_rank=8, qk_rope_head_dim=4,
        qk_nope_head_dim=4, v_head_dim=8,
    )
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(config).eval()
    ids = torch.randint(0, 64, (1, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids).logits
        got = hloalias.compile(model, (ids,))(ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
