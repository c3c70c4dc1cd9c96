"""Plain greedy decode of a MoE target on the CPU: hyspec's engine beside transformers, same weights.

A Mixtral-shaped random model (hidden 1024, 8 experts, top-2, expert width 2048, 4 layers, 16 query / 4 KV
heads, vocabulary 32000) is written in the published Hugging Face layout, then decoded greedily from the same
prompt by transformers (``generate``, fp32, its own KV cache) and by hyspec (``LLM``, cpu backend, fp32),
interleaved over several rounds.  Reported: decode tokens/s (prefill excluded: the time to the first token is
measured separately and subtracted), whether both produced the same tokens, and hyspec at batch 8 (aggregate
tokens/s: the grouped-expert path with several tokens per expert).

    .venv/bin/python docs/results/2026-12-06/moe/run.py --out docs/results/2026-12-06/moe/result.json
    .venv/bin/python docs/results/2026-12-06/moe/run.py --small   # seconds: proves the script runs
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch


def make_target(path: Path, small: bool) -> None:
    import transformers

    dims = dict(hidden_size=128, intermediate_size=256, vocab_size=512) if small else dict(
        hidden_size=1024, intermediate_size=2048, vocab_size=32000)
    cfg = transformers.MixtralConfig(num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4,
                                     num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=4096,
                                     sliding_window=None, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                                     **dims)
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("gate.weight"):
                p.normal_()  # routers that spread tokens over the experts
    model.save_pretrained(path, safe_serialization=True)


def hf_decode(path: Path, prompt: list[int], steps: int) -> tuple[list[int], float, float]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids, max_new_tokens=2, **kw)  # warm-up
        t = time.perf_counter()
        model.generate(ids, max_new_tokens=1, **kw)
        first = time.perf_counter() - t
        t = time.perf_counter()
        out = model.generate(ids, max_new_tokens=steps + 1, **kw)
        total = time.perf_counter() - t
    return out[0, len(prompt):].tolist(), first, total


def hyspec_decode(llm, prompts: list[list[int]], steps: int) -> tuple[list[list[int]], float, float]:
    from hyspec import SamplingParams

    reqs = [{"prompt_token_ids": p} for p in prompts]
    llm.generate(reqs, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))  # warm-up
    t = time.perf_counter()
    llm.generate(reqs, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    first = time.perf_counter() - t
    t = time.perf_counter()
    outs = llm.generate(reqs, SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True))
    total = time.perf_counter() - t
    return [list(o.outputs[0].token_ids) for o in outs], first, total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true", help="a toy model and few steps: checks the script runs")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    steps = 8 if args.small else args.steps
    rounds = 1 if args.small else args.rounds
    from hyspec import LLM

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        make_target(path, args.small)
        vocab = json.loads((path / "config.json").read_text())["vocab_size"]
        g = torch.Generator().manual_seed(1)
        prompts = [torch.randint(3, vocab, (32,), generator=g).tolist() for _ in range(8)]
        llm = LLM(str(path), dtype="float32", backend="cpu", skip_tokenizer_init=True, kv_cache_bytes=64 << 20)
        rows = {"transformers_b1": [], "hyspec_b1": [], "hyspec_b8": []}
        same = True
        for _ in range(rounds):
            hf_tokens, first, total = hf_decode(path, prompts[0], steps)
            rows["transformers_b1"].append(steps / (total - first))
            (hy_tokens,), first, total = hyspec_decode(llm, prompts[:1], steps)
            rows["hyspec_b1"].append(steps / (total - first))
            same &= hy_tokens == hf_tokens
            _, first, total = hyspec_decode(llm, prompts, steps)
            rows["hyspec_b8"].append(8 * steps / (total - first))
    result = {
        "what": "plain greedy decode tokens/s after a 32-token prompt, fp32, Mixtral-shaped random target",
        "model": "hidden 1024, 8 experts top-2, expert width 2048, 4 layers, 16/4 heads, vocab 32000"
                 if not args.small else "toy (--small)",
        "steps": steps, "rounds": rounds,
        "tokens_per_s_median": {k: round(statistics.median(v), 2) for k, v in rows.items()},
        "tokens_per_s_all": {k: [round(x, 2) for x in v] for k, v in rows.items()},
        "same_tokens_as_transformers": same,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
                    "load_average_at_end": os.getloadavg()},
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
