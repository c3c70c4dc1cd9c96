"""Write a "7B-shaped" llama GGUF with random weights: Llama-2-7B's layer (hidden 4096, 32 heads, MLP 11008) for a
few layers, SmolLM2's tokenizer (copied from the default model's file, so llama.cpp and hyspec both load it) and a
49152 x 4096 embedding and head. Matrices are F16; requantize it with llama.cpp to get the K-quant mix a real 7B
Q4_K_M holds (Q4_K for most matrices, Q6_K for the head and for attn_v / ffn_down in some layers):

    .venv/bin/python scripts/make_7b_shaped_gguf.py /tmp/7b-f16.gguf --layers 4
    $LLAMACPP_PY scripts/llamacpp_requantize.py /tmp/7b-f16.gguf /tmp/7b-q4km.gguf --type Q4_K_M

What it is for: measuring kernels where K-quants dominate (SmolLM2's 576-wide rows are not whole 256-weight
super-blocks, so its Q4_K_M file is mostly Q5_0). The tokens it generates mean nothing; speed does not depend on
the values.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

HIDDEN, HEADS, KV_HEADS, MLP = 4096, 32, 32, 11008
COPIED_PREFIXES = ("tokenizer.",)


def _copy_tokenizer(writer, source: Path) -> int:
    """The default model's tokenizer fields into ``writer``; returns the vocabulary size."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith(COPIED_PREFIXES):
            continue
        value = field.contents()
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_array(key, value)
            if key == "tokenizer.ggml.tokens":
                vocab = len(value)
        elif kind == gguf.GGUFValueType.STRING:
            writer.add_string(key, value)
        elif kind == gguf.GGUFValueType.BOOL:
            writer.add_bool(key, bool(value))
        elif kind == gguf.GGUFValueType.UINT32:
            writer.add_uint32(key, int(value))
        else:
            raise ValueError(f"{source}: unexpected tokenizer field type {kind} for {key}")
    if not vocab:
        raise ValueError(f"{source}: no tokenizer.ggml.tokens to copy")
    return vocab


def main() -> int:
    import gguf

    from hyspec.assets import default_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.layers < 1:
        ap.error("--layers must be at least 1")
    rng = np.random.default_rng(args.seed)
    w = gguf.GGUFWriter(str(args.out), "llama")
    w.add_name("7B-shaped random llama (hyspec benchmark)")
    w.add_block_count(args.layers)
    w.add_context_length(4096)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(MLP)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    vocab = _copy_tokenizer(w, Path(default_model()))
    w.add_vocab_size(vocab)

    def matrix(rows: int, cols: int) -> np.ndarray:  # [out, in], as GGUF stores a linear's weight
        return (rng.standard_normal((rows, cols), dtype=np.float32) * (1.0 / np.sqrt(cols))).astype(np.float16)

    w.add_tensor("token_embd.weight", matrix(vocab, HIDDEN))
    head_dim = HIDDEN // HEADS
    for i in range(args.layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        w.add_tensor(p + "attn_q.weight", matrix(HEADS * head_dim, HIDDEN))
        w.add_tensor(p + "attn_k.weight", matrix(KV_HEADS * head_dim, HIDDEN))
        w.add_tensor(p + "attn_v.weight", matrix(KV_HEADS * head_dim, HIDDEN))
        w.add_tensor(p + "attn_output.weight", matrix(HIDDEN, HEADS * head_dim))
        w.add_tensor(p + "ffn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", matrix(MLP, HIDDEN))
        w.add_tensor(p + "ffn_up.weight", matrix(MLP, HIDDEN))
        w.add_tensor(p + "ffn_down.weight", matrix(HIDDEN, MLP))
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    w.add_tensor("output.weight", matrix(vocab, HIDDEN))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{args.out}: {args.layers} layers of hidden {HIDDEN}, MLP {MLP}, vocabulary {vocab}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
