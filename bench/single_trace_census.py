"""Census of the static single trace on transformers models: which path
each model's first import takes (frontend/single_trace.py: the one
``make_fx`` trace, ``torch.export``'s post-dispatch trace after it
declined, or the training IR and the decomposition retrace) and why the
``make_fx`` trace declined; with ``--compare``, whether its import equals
the two traces' (module text and signature) and its compiled outputs
equal eager's.

From the repository root::

    .venv/bin/python -m bench.single_trace_census [--compare] [--models llama,gpt2]

Random-weight configs, small.  Nothing is timed: the figures live in
bench/RESULTS-latency.md."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _models() -> dict[str, Callable[[], tuple[Any, tuple[Any, ...], dict[str, Any]]]]:
    import torch
    import transformers as tf

    def ids(vocab: int, length: int = 16) -> torch.Tensor:
        return torch.randint(0, vocab, (1, length))

    def llama() -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        from bench.latency import LLAMA

        return tf.LlamaForCausalLM(tf.LlamaConfig(**LLAMA)).eval(), (ids(256),), {}

    def gpt2() -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        config = tf.GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4)
        return tf.GPT2LMHeadModel(config).eval(), (ids(256),), {}

    def bert() -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        config = tf.BertConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=128, max_position_embeddings=64)
        return tf.BertModel(config).eval(), (ids(256),), {}

    def qwen2() -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        config = tf.Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
        return tf.Qwen2ForCausalLM(config).eval(), (ids(256),), {}

    def t5() -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        config = tf.T5Config(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                             decoder_start_token_id=0)
        return tf.T5ForConditionalGeneration(config).eval(), (ids(256),), {"decoder_input_ids": ids(256, 8)}

    def bart() -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        config = tf.BartConfig(vocab_size=256, d_model=64, encoder_layers=2, decoder_layers=2,
                               encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                               decoder_ffn_dim=128, max_position_embeddings=64)
        return tf.BartForConditionalGeneration(config).eval(), (ids(256),), {"decoder_input_ids": ids(256, 8)}

    def vit() -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        config = tf.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                              image_size=32, patch_size=8)
        return tf.ViTModel(config).eval(), (torch.randn(1, 3, 32, 32),), {}

    def whisper() -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        config = tf.WhisperConfig(vocab_size=256, num_mel_bins=16, encoder_layers=2, decoder_layers=2,
                                  encoder_attention_heads=4, decoder_attention_heads=4, d_model=64,
                                  encoder_ffn_dim=128, decoder_ffn_dim=128, max_source_positions=32,
                                  max_target_positions=32, decoder_start_token_id=1, pad_token_id=0)
        return (tf.WhisperForConditionalGeneration(config).eval(), (torch.randn(1, 16, 64),),
                {"decoder_input_ids": ids(256, 8)})

    return {"llama": llama, "gpt2": gpt2, "bert": bert, "qwen2": qwen2, "t5": t5, "bart": bart, "vit": vit,
            "whisper": whisper}


def _leaves(tree: Any) -> list[Any]:
    import torch
    import torch.utils._pytree as pytree

    if hasattr(tree, "to_tuple"):
        tree = tree.to_tuple()
    return [leaf for leaf in pytree.tree_leaves(tree) if isinstance(leaf, torch.Tensor)]


def census(name: str, compare: bool) -> dict[str, Any]:
    import torch

    import hloalias
    from hloalias.frontend import fx_export, importer, single_trace

    torch.manual_seed(0)
    model, args, kwargs = _models()[name]()
    single_trace.clear_single_trace_stats()
    program = importer.import_torch(model, args, kwargs)
    stats = single_trace.single_trace_stats()
    path = next(p for p in ("make_fx", "post_dispatch", "training_ir") if getattr(stats, p))
    result: dict[str, Any] = {"model": name, "path": path, "reasons": list(stats.reasons)}
    if compare:
        # The other paths of the same import: the make_fx trace declined
        # (torch.export's post-dispatch trace), and every single trace
        # declined (the training IR and the decomposition retrace).
        for label, owner, attribute in (("post_dispatch", fx_export, "exported_from_trace"),
                                        ("training_ir", importer, "_export_decomposed")):
            original = getattr(owner, attribute)
            setattr(owner, attribute, lambda *_, **__: None)
            try:
                other = importer.import_torch(model, args, kwargs)
            finally:
                setattr(owner, attribute, original)
            result[f"same_text_as_{label}"] = program.text == other.text
            result[f"same_signature_as_{label}"] = program.signature == other.signature
        exe = hloalias.compile(model, args, kwargs)
        with torch.no_grad():
            ours, eager = _leaves(exe(*args, **kwargs)), _leaves(model(*args, **kwargs))
        result["eager_equal"] = len(ours) == len(eager) and all(
            a.shape == b.shape and torch.allclose(a, b, atol=1e-4, rtol=1e-4) for a, b in zip(ours, eager))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama,gpt2,bert,qwen2,t5,bart,vit,whisper")
    parser.add_argument("--compare", action="store_true")
    options = parser.parse_args()
    for name in options.models.split(","):
        try:
            print(census(name, options.compare), flush=True)
        except Exception as error:  # one model's failure is a census entry
            print({"model": name, "error": f"{type(error).__name__}: {str(error)[:300]}"}, flush=True)


if __name__ == "__main__":
    main()
