"""CPU path benchmark: target forward cost per verified token count, before and after the CPU fast path,
and the ONNX Runtime draft_model drafter against the torch one.

    .venv/bin/python scripts/bench_cpu_path.py [--model DIR] [--drafter DIR] [--quantized default,a8] [--json OUT]

"before" runs the model as loaded (reference ops, ``F.linear``); "after" loads it with the CPU backend's
op table and applies its ``optimize_model`` (packed oneDNN/MKL weights) exactly as the engine does.  Each figure is the median
of --repeats forwards of n tokens after a 128-token context, at bs 1, with the threads torch uses.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch


def forward_costs(model_dir, dtype: str, optimize: bool, counts, repeats: int,
                  quantization: str | None = "none") -> dict[int, float]:
    """``quantization`` other than "none" loads as the engine does (a GGUF's blocks on the backend's kernels)."""
    from hyspec.backends.registry import get_backend
    from hyspec.kv.pool import KVPool
    from hyspec.kv.sequence_kv import SequenceKV
    from hyspec.model.loader import load_model
    from hyspec.seam.forward import LAST_LOGITS, Feed, ModelRunner

    if quantization != "none":  # the engine's load: the checkpoint's own codes (or a8) on the backend's kernels
        backend = get_backend("cpu")
        model = backend.optimize_model(load_model(model_dir, dtype=dtype, ops=backend.ops, backend=backend,
                                                  quantization=quantization))
    elif optimize:  # the CPU backend's op table (packed logits) and its optimize_model (packed linears)
        backend = get_backend("cpu")
        model = backend.optimize_model(load_model(model_dir, dtype=dtype, ops=backend.ops))
    else:
        model = load_model(model_dir, dtype=dtype)
    cfg, dt = model.config, model.embed_tokens.weight.dtype
    page = KVPool.page_bytes_for(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, dt, 16)
    pool = KVPool(512, page)
    layout = pool.register("target", cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, dt, 16)
    runner = ModelRunner(model, layout, torch.device("cpu"))
    kv = SequenceKV(pool, layout)
    kv.reserve(128 + max(counts))
    context = torch.randint(1, cfg.vocab_size, (128 + max(counts),)).tolist()
    runner.run([Feed(kv, context[:128], 0, logits=LAST_LOGITS)])
    out = {}
    for n in counts:
        times = []
        for _ in range(repeats + 2):
            kv.truncate(128)
            kv.reserve(128 + n)
            t0 = time.perf_counter()
            runner.run([Feed(kv, context[128:128 + n], 128)])
            times.append(time.perf_counter() - t0)
        out[n] = statistics.median(times[2:])
    return out


def drafter_costs(drafter_dir, steps: int, repeats: int) -> dict[str, float]:
    """Per-token incremental step and 128-token prefill: ONNX Runtime vs the torch drafter (fp32, bs 1)."""
    from hyspec.cpu_ops.onnx_drafter import OnnxDraftModel

    onnx = OnnxDraftModel.from_drafter_dir(drafter_dir, num_threads=torch.get_num_threads())
    prompt = list(range(5, 133))
    pre, step = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        logits, state = onnx.prefill([prompt])
        pre.append(time.perf_counter() - t0)
        tok = int(logits[0].argmax())
        t0 = time.perf_counter()
        for _ in range(steps):
            logits, state = onnx.step([tok], state)
            tok = int(logits[0].argmax())
        step.append((time.perf_counter() - t0) / steps)
    torch_costs = forward_costs(drafter_dir, "float32", True, (1, 128), repeats)
    return {"onnx_step_s": statistics.median(step), "onnx_prefill128_s": statistics.median(pre),
            "torch_step_s": torch_costs[1], "torch_prefill128_s": torch_costs[128]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--drafter", default=None, help="draft_model drafter dir (default: the embedded one)")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--counts", default="1,2,4,8,16,32")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json", default=None)
    ap.add_argument("--quantized", default=None, metavar="default|a8",
                    help="also time the engine's own load of a GGUF: its blocks on hyspec's fp32 kernel "
                         "(default) or times 8-bit activations (a8); the cost per verified row count")
    args = ap.parse_args(argv)
    from hyspec.assets import default_drafter, default_model

    model = args.model or default_model()
    counts = [int(c) for c in args.counts.split(",")]
    result = {"model": str(model), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "cpu_capability": torch.backends.cpu.get_cpu_capability(), "forward_ms": {}}
    print(f"target forward, ms per call (bs 1, 128-token context, median of {args.repeats}); "
          f"{torch.get_num_threads()} threads")
    print(f"{'dtype':10s} {'path':7s} " + " ".join(f"{'n=' + str(n):>7s}" for n in counts))
    for dtype in [d for d in args.dtypes.split(",") if d]:  # --dtypes "": the quantized rows only
        for label, optimize in (("before", False), ("after", True)):
            costs = forward_costs(model, dtype, optimize, counts, args.repeats)
            result["forward_ms"][f"{dtype}/{label}"] = {n: round(c * 1e3, 3) for n, c in costs.items()}
            print(f"{dtype:10s} {label:7s} " + " ".join(f"{c * 1e3:7.2f}" for c in costs.values()))
    for q in (args.quantized.split(",") if args.quantized else ()):
        costs = forward_costs(model, "float32", True, counts, args.repeats, None if q == "default" else q)
        result["forward_ms"][f"gguf-blocks/{q}"] = {n: round(c * 1e3, 3) for n, c in costs.items()}
        print(f"{'blocks':10s} {q:7s} " + " ".join(f"{c * 1e3:7.2f}" for c in costs.values()))
    try:
        drafter = args.drafter or default_drafter("draft_model")
        d = drafter_costs(drafter, steps=32, repeats=5)
        result["drafter"] = {k: round(v * 1e3, 3) for k, v in d.items()}
        print("draft_model drafter, ms: " + ", ".join(f"{k.removesuffix('_s')} {v * 1e3:.2f}" for k, v in d.items()))
    except Exception as exc:  # the ONNX part needs onnxruntime and a trained draft_model drafter
        result["drafter"] = {"skipped": str(exc)}
        print(f"draft_model drafter: skipped ({exc})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
