"""What a verification of T rows costs against a decode step, on the default model's decoder stack.

Times hyspec.cpu_ops.decoder_stack for T = 1, 2, 3, 4, 6, 8 rows of one sequence at context ~100
(all 30 layers, best of 5 x 50 calls, 2 threads) and the Q8_0 head for the same rows: the cost model
behind "speculation does not pay here" (a row of verification against a decode step).
QUANTIZATION=a8 in the environment: the same with 8-bit activations.
Run from the repository root: python docs/results/2026-12-03/cpu-vs-llamacpp-zen4/verify_cost.py"""
import os
import time

import torch

torch.set_num_threads(2)
from hyspec import LLM, SamplingParams  # noqa: E402

llm = LLM(max_model_len=1024, quantization=os.environ.get("QUANTIZATION") or None)
model = llm.engine.model
stack = model.layer_stack
captured = {}
orig = stack.run
orig_aux = stack.run_aux  # CausalLM.forward calls run_aux (one call, aux layers captured on the way)


def spy(h, residual, first, last, positions, kv, meta, aux_layers):
    if h.shape[0] == 1 and "kv" not in captured and meta.seq_lens_host[0] > 100:
        captured.update(kv=kv, meta=meta)
    return orig_aux(h, residual, first, last, positions, kv, meta, aux_layers)


stack.run_aux = spy
llm.chat([{"role": "user", "content": "Write a Python function that checks whether a number is prime."}],
         SamplingParams(max_tokens=80, temperature=0, ignore_eos=True))
stack.run_aux = orig_aux
from hyspec.ops.attention import AttentionMetadata  # noqa: E402

m0 = captured["meta"]
ctx = m0.seq_lens_host[0] - 1


def bench(fn, n=50):
    fn()
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t) / n)
    return best * 1e3


base = None
print(f"context {ctx} tokens; {stack.num_layers} layers; times in ms (x: against T = 1)")
print(f"{'T':>3} {'stack':>8} {'x':>6} {'head':>7} {'x':>6} {'total':>7} {'x':>6} {'per extra row':>14}")
for T in (1, 2, 3, 4, 6, 8):
    positions = torch.arange(ctx, ctx + T)
    bs = captured["kv"][0][0].shape[1]
    slots = m0.block_tables[0, positions // bs].to(torch.int64) * bs + positions % bs  # the sequence's own next slots
    meta = AttentionMetadata(query_start_loc=torch.tensor([0, T], dtype=torch.int32),
                             seq_lens=torch.tensor([ctx + T], dtype=torch.int32), block_tables=m0.block_tables,
                             slot_mapping=slots, positions=positions, tree_mask=None, query_lens=[T],
                             seq_lens_host=[ctx + T])
    h = model.embed(torch.tensor([1000 + 37 * i for i in range(T)]))  # real embeddings: realistic magnitudes
    s = bench(lambda: orig(h, None, 0, stack.num_layers, positions, captured["kv"], meta))
    hd = bench(lambda: model.compute_logits(h))
    if base is None:
        base = (s, hd, s + hd)
    extra = "" if T == 1 else f"{(s + hd - base[2]) / (T - 1) / base[2]:.2f} step"
    print(f"{T:>3} {s:8.2f} {s / base[0]:6.2f} {hd:7.2f} {hd / base[1]:6.2f} {s + hd:7.2f} {(s + hd) / base[2]:6.2f} "
          f"{extra:>14}")

# the same rows through the layer loop (qgemm.so and the op table between layers), for comparison
print("layer loop (HYSPEC_DECODER_STACK=0's path):")
model.layer_stack = None
for T in (1, 2, 4):
    positions = torch.arange(ctx, ctx + T)
    bs = captured["kv"][0][0].shape[1]
    slots = m0.block_tables[0, positions // bs].to(torch.int64) * bs + positions % bs
    meta = AttentionMetadata(query_start_loc=torch.tensor([0, T], dtype=torch.int32),
                             seq_lens=torch.tensor([ctx + T], dtype=torch.int32), block_tables=m0.block_tables,
                             slot_mapping=slots, positions=positions, tree_mask=None, query_lens=[T],
                             seq_lens_host=[ctx + T])
    ids = torch.tensor([1000 + 37 * i for i in range(T)])
    with torch.inference_mode():
        s = bench(lambda: model(ids, positions, captured["kv"], meta))
    print(f"{T:>3} {s:8.2f}")
model.layer_stack = stack
