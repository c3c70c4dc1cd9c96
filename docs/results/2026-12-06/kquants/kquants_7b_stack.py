"""Decode-step projections of a 7B-shaped stack stored as Q4_K_M: dense dequantized (before) vs as stored (after).

Llama-2-7B's shapes (hidden 4096, intermediate 11008, no GQA), ``--layers`` layers of random blocks in a
Q4_K_M-like mix (llama.cpp's Q4_K_M keeps v and down in Q6_K in about a third of the layers and the rest in
Q4_K; here layer 0 takes the Q6_K ones and the others are all Q4_K).  Each layer is the four fused
projections the engine builds from the file:

* before: what hyspec did with these types until kquants.c -- the gguf package's dequantization to fp32 and
  the engine's dense fp32 linear (PackedLinear, hyspec's batch-invariant dense_gemm.c where it builds);
* after: the same blocks through hyspec.cpu_ops.quantized_linear (BlockLinear / RowConcatLinear on qgemm);
* q4_1 (reference, other values): every matrix in Q4_1 blocks, the path hyspec already computed as stored.

Both compute the same values (checked below on the first layer, fp32 rounding apart).  Timed: the projections
of one decode step (attention and norms are a small part of a 7B step at short context and are not in it),
``rows`` rows of x, rounds alternating before / after, median per round.  tokens/s = rows / step time.

    TORCH_DEVICE_BACKEND_AUTOLOAD=0 .venv/bin/python docs/results/2026-12-06/kquants/kquants_7b_stack.py \
        --layers 2 --rows 1 8 --rounds 5 --out docs/results/2026-12-06/kquants/kquants_7b_stack.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np
import torch

HIDDEN, INTERMEDIATE = 4096, 11008


def random_blocks(qtype: str, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Random codes and packed scales, fp16 scale fields of a trained 7B's magnitude (layouts: gguf's quants.py)."""
    import gguf

    elems, nbytes = gguf.GGML_QUANT_SIZES[getattr(gguf.GGMLQuantizationType, qtype)]
    raw = rng.integers(0, 256, (n, k // elems, nbytes), dtype=np.uint8)
    for off in {"Q4_K": (0, 2), "Q6_K": (208,), "Q4_1": (0, 2)}[qtype]:
        raw[..., off:off + 2] = (np.abs(rng.standard_normal((n, k // elems))) * 1e-3 + 1e-4).astype(
            np.float16).view(np.uint8).reshape(n, k // elems, 2)
    return raw.reshape(n, -1)


def layer_types(i: int) -> dict[str, str]:
    six = "Q6_K" if i == 0 else "Q4_K"
    return {"q": "Q4_K", "k": "Q4_K", "v": six, "o": "Q4_K", "gate": "Q4_K", "up": "Q4_K", "down": six}


def build_layer(i: int, rng: np.random.Generator):
    """(before, after, q4_1) modules for the fused qkv, o, gate_up and down projections of layer i."""
    from hyspec.cpu_ops.packed_linear import PackedLinear
    from hyspec.cpu_ops.quantized_linear import quantized_linear
    from hyspec.model.quant import concat_rows, dequantize, from_gguf, stored_blocks

    types = layer_types(i)
    shapes = {"q": (HIDDEN, HIDDEN), "k": (HIDDEN, HIDDEN), "v": (HIDDEN, HIDDEN), "o": (HIDDEN, HIDDEN),
              "gate": (INTERMEDIATE, HIDDEN), "up": (INTERMEDIATE, HIDDEN), "down": (HIDDEN, INTERMEDIATE)}
    stored = {name: stored_blocks(types[name], random_blocks(types[name], *shape, rng), shape, name)
              for name, shape in shapes.items()}
    before, after, q4_1 = [], [], []
    for group in (("q", "k", "v"), ("o",), ("gate", "up"), ("down",)):
        w = concat_rows([stored[n] for n in group])
        module = quantized_linear(w, None, torch.float32)
        if module is None:
            raise SystemExit("hyspec's qgemm kernel did not build here: nothing to measure")
        after.append(module)
        before.append(PackedLinear(dequantize(w), None))
        n, k = w.shape
        q4_1.append(quantized_linear(from_gguf("Q4_1", random_blocks("Q4_1", n, k, rng), (n, k)), None, torch.float32))
    return before, after, q4_1


def step(modules: list, inputs: dict[int, torch.Tensor]) -> None:
    """One decode step's projections: each module on a ready input of its width (no element-wise work between)."""
    with torch.inference_mode():
        for m in modules:
            m(inputs[m.in_features])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="decode steps timed per round and path")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    layers = [build_layer(i, rng) for i in range(args.layers)]
    paths = {"before": [m for b, _, _ in layers for m in b], "after": [m for _, a, _ in layers for m in a],
             "q4_1": [m for _, _, q in layers for m in q]}
    before, after = paths["before"], paths["after"]
    # the two paths compute the same matrix: compare layer 0's projections on one row
    worst = 0.0
    with torch.inference_mode():
        for b, a in zip(layers[0][0], layers[0][1]):
            xi = torch.randn(1, b.in_features)
            ref, got = b(xi), a(xi)
            worst = max(worst, float((ref - got).abs().max() / ref.abs().max()))
    assert worst < 1e-4, worst
    from hyspec.cpu_ops import qgemm

    result = {"what": "decode-step projections of a 7B-shaped Q4_K_M-like stack, dense dequantized vs as stored",
              "machine": platform.processor() or platform.machine(), "cpu_model": _cpu_model(),
              "threads": args.threads, "layers": args.layers, "kernel_isa": qgemm.isa(),
              "load_average_at_start": os.getloadavg(), "max_relative_difference_layer0": worst,
              "bytes_per_step": {"before": sum(m.weight.numel() * 4 for m in before),
                                 "after": sum(sum(b.numel() for b in m.buffers()) for m in after),
                                 "q4_1": sum(sum(b.numel() for b in m.buffers()) for m in paths["q4_1"])},
              "rows": {}}
    for rows in args.rows:
        x = {HIDDEN: torch.randn(rows, HIDDEN), INTERMEDIATE: torch.randn(rows, INTERMEDIATE)}
        for modules in paths.values():  # warm
            step(modules, x)
        times = {name: [] for name in paths}
        cpu = {name: [] for name in paths}  # this process's CPU time (all threads): less moved by other load
        for _ in range(args.rounds):
            for name, modules in paths.items():
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(args.steps):
                    step(modules, x)
                times[name].append((time.perf_counter() - t0) / args.steps)
                cpu[name].append((time.process_time() - c0) / args.steps)
        med = {k: statistics.median(v) for k, v in times.items()}
        med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
        result["rows"][rows] = {
            "step_ms": {k: round(v * 1e3, 2) for k, v in med.items()},
            "tokens_per_s": {k: round(rows / v, 2) for k, v in med.items()},
            "speedup_after_over_before": round(med["before"] / med["after"], 2),
            "step_cpu_ms": {k: round(v * 1e3, 2) for k, v in med_cpu.items()},
            "cpu_time_ratio_before_over_after": round(med_cpu["before"] / med_cpu["after"], 2),
            "per_round_ms": {k: [round(t * 1e3, 2) for t in v] for k, v in times.items()}}
        print(rows, result["rows"][rows]["step_ms"], result["rows"][rows]["speedup_after_over_before"],
              result["rows"][rows]["step_cpu_ms"], flush=True)
    result["load_average_at_end"] = os.getloadavg()
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.machine()


if __name__ == "__main__":
    main()
