"""Issue 29, a mutated bf16 user input stored as its bits, tried as a user
would: a tiny bf16 transformers Llama (random weights) with the caller's
bf16 ``StaticCache`` (prefill of T tokens, and decode), and the user's own
attention block that ``index_copy_``s its bf16 KV tensors.  Each is
compiled with ``CPU_PIPELINE`` (what ``hloalias.compile`` runs) and with it
less ``store-state-as-bits``; prints XLA's byte figures of both, whether
they compute the same bits (logits, caches, the caller's objects kept) and
the largest difference from eager.  ``.venv/bin/python -m bench.input_bits_trial``;
numbers go in ``RESULTS-temp.md``."""
import copy, torch, transformers, hloalias
import torch.nn.functional as F
from hloalias.pipeline import CPU_PIPELINE
WITHOUT = CPU_PIPELINE.replace(", store-state-as-bits", "")
torch.manual_seed(0)
config = transformers.LlamaConfig(vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, intermediate_size=128, max_position_embeddings=512)
model = transformers.LlamaForCausalLM(config).eval().to(torch.bfloat16)
def ratio(exe):
    s = exe.memory_stats; m = s['argument_bytes'] + s['output_bytes'] - s['alias_bytes']
    return f"arg {s['argument_bytes']:,} out {s['output_bytes']:,} alias {s['alias_bytes']:,} temp {s['temp_bytes']:,} total {s['total_bytes']:,} min {m:,} = {s['total_bytes']/m:.4f}x"

def hf(L, T):
    def mk():
        c = transformers.StaticCache(config=config, max_cache_len=L)
        c.early_initialization(1, 2, 16, torch.bfloat16, torch.device("cpu"))
        return c
    ids = torch.randint(0, 64, (1, T), generator=torch.Generator().manual_seed(1))
    kw = lambda c, t, p: {"input_ids": t, "past_key_values": c, "use_cache": True, "cache_position": torch.arange(p * T, p * T + T)}
    exes = {}
    for name, pipe in (("without", WITHOUT), ("with", CPU_PIPELINE)):
        exes[name] = hloalias.compile(copy.deepcopy(model), (), kw(mk(), ids, 0), pipeline=pipe)
        print(f"  HF StaticCache L={L} T={T} {name:7s} store-state-as-bits: {ratio(exes[name])}; input bits: {len(exes[name]._input_bits)}")
    caches = {n: mk() for n in ("without", "with", "eager")}
    held = {n: (c.layers[0], c.layers[0].keys) for n, c in caches.items()}
    same = True; worst = 0.0; t = ids
    for p in range(3):
        outs = {n: exes[n](**kw(caches[n], t, p)) for n in exes}
        with torch.no_grad():
            eo = model(**kw(caches["eager"], t, p))
        same = same and torch.equal(outs["with"].logits, outs["without"].logits) and outs["with"].past_key_values is caches["with"]
        for a, b in zip(caches["with"].layers, caches["without"].layers):
            same = same and a.keys.dtype == torch.bfloat16 and torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
        worst = max(worst, float((outs["with"].logits.float() - eo.logits.float()).abs().max()))
        t = eo.logits[:, -T:].argmax(-1)
    same = same and caches["with"].layers[0] is held["with"][0] and caches["with"].layers[0].keys is held["with"][1]
    print(f"    with == without bit for bit (logits, caches, objects kept): {same}; largest logit difference from eager: {worst:.3g} (bf16 compute)")

class UserAttention(torch.nn.Module):
    """The user's own decoder attention: bf16 projections, index_copy_ into the caller's bf16 KV tensors."""
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (torch.nn.Linear(64, 64, bias=False) for _ in range(4))
    def forward(self, x, pos, k_cache, v_cache):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, 4, 16).transpose(1, 2)
        k_cache.index_copy_(2, pos, self.k(x).view(b, t, 4, 16).transpose(1, 2))
        v_cache.index_copy_(2, pos, self.v(x).view(b, t, 4, 16).transpose(1, 2))
        L = k_cache.shape[2]
        mask = torch.arange(L)[None, :] <= pos[:, None]
        y = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask)
        return self.o(y.transpose(1, 2).reshape(b, t, 64))

def user(L, T):
    torch.manual_seed(3)
    m = UserAttention().to(torch.bfloat16).eval()
    kv = lambda: (torch.zeros(1, 4, L, 16, dtype=torch.bfloat16), torch.zeros(1, 4, L, 16, dtype=torch.bfloat16))
    x = torch.randn(1, T, 64, dtype=torch.bfloat16)
    exes = {}
    for name, pipe in (("without", WITHOUT), ("with", CPU_PIPELINE)):
        exes[name] = hloalias.compile(copy.deepcopy(m), (x, torch.arange(T)) + kv(), pipeline=pipe)
        print(f"  user index_copy_ KV L={L} T={T} {name:7s} store-state-as-bits: {ratio(exes[name])}; input bits: {len(exes[name]._input_bits)}")
    caches = {n: kv() for n in ("without", "with", "eager")}
    same = True; worst = 0.0
    for p in range(3):
        x = torch.randn(1, T, 64, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(p))
        pos = torch.arange(p * T, p * T + T)
        outs = {n: exes[n](x, pos, *caches[n]) for n in exes}
        with torch.no_grad():
            want = m(x, pos, *caches["eager"])
        same = same and torch.equal(outs["with"], outs["without"])
        for n in ("with", "without"):
            same = same and all(c.dtype == torch.bfloat16 and torch.equal(c, e) for c, e in zip(caches[n], caches["eager"]))
        worst = max(worst, float((outs["with"].float() - want.float()).abs().max()))
    print(f"    with == without bit for bit, KV caches == eager's exactly: {same}; largest output difference from eager: {worst:.3g}")

if __name__ == "__main__":
    for L, T in ((256, 8), (256, 1), (4096, 8)):
        hf(L, T)
    for L, T in ((256, 8), (4096, 8), (4096, 1)):
        user(L, T)
