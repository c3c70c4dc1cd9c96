"""How close hyspec's quantized CPU paths are to dense fp32 on the same dequantized values (the default GGUF).

For each prompt (the chat set and code heads of hyspec.bench.vs_transformers) every configuration decodes
greedily; then the dense fp32 model (the reference: the file's values dequantized by the gguf package,
computed with dense fp32 matmuls) scores each configuration's whole sequence in one forward, and the
configuration's own logits at every generated position are compared with it:

* ``max |logit diff|`` over every position and vocabulary entry;
* ``token-identical``: the configuration's greedy tokens equal the reference's;
* at a first divergence, the reference's gap between its own choice and the configuration's.

Configurations: ``gguf fp32`` (hyspec's qgemm over the Q4_1/Q8_0 blocks, fp32 activations: the default on
a CPU where it builds), ``gguf a8`` (the same blocks times 8-bit activations, ``quantization="a8"``, where
the CPU has AVX-512 VNNI), ``gguf bf16`` (torch's int4/int8 kernels, bf16), ``dense bf16``.

    python scripts/check_quantized_numerics.py [--max-tokens 128] [--configs "gguf fp32,gguf a8"] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--num-chat", type=int, default=4)
    parser.add_argument("--num-code", type=int, default=4)
    parser.add_argument("--json", default=None)
    parser.add_argument("--configs", default=None, help="comma-separated subset of the configurations")
    args = parser.parse_args()
    torch.set_num_threads(2)
    from hyspec import LLM, SamplingParams
    from hyspec.bench.vs_transformers import prompt_ids

    from hyspec.cpu_ops.qgemm_a8 import available

    configs = {"gguf fp32": dict(dtype="float32"), "gguf a8": dict(dtype="float32", quantization="a8"),
               "gguf bf16": dict(dtype="bfloat16"), "dense bf16": dict(dtype="bfloat16", quantization="none")}
    if not available()[0]:
        print(f"gguf a8 skipped: {available()[1]}")
        del configs["gguf a8"]
    if args.configs:
        configs = {k: v for k, v in configs.items() if k in args.configs.split(",")}
    reference = LLM(dtype="float32", quantization="none", max_model_len=1024)
    prompts = prompt_ids(reference.tokenizer, args.num_chat, args.num_code)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)

    def logits_of(llm, ids):
        model = llm.engine.model
        with torch.inference_mode():
            return model.compute_logits(model.forward_dense(torch.tensor([ids])).hidden[0]).float()

    ref_out = {name: reference.generate([ids], params)[0].outputs[0].token_ids for name, ids in prompts}
    report = {"max_tokens": args.max_tokens, "prompts": len(prompts), "configs": {}}
    for label, kwargs in configs.items():
        llm = LLM(max_model_len=1024, **kwargs)
        start = time.perf_counter()
        rows, worst, identical = [], 0.0, 0
        for name, ids in prompts:
            out = llm.generate([ids], params)[0].outputs[0].token_ids
            seq = list(ids) + list(out)
            mine, ref = logits_of(llm, seq)[len(ids) - 1:-1], logits_of(reference, seq)[len(ids) - 1:-1]
            diff = float((mine - ref).abs().max())
            worst = max(worst, diff)
            expected = ref_out[name]
            first = next((i for i, (a, b) in enumerate(zip(out, expected)) if a != b), None)
            identical += first is None
            gap = None
            if first is not None:  # the reference's own margin at the step where they part
                r = logits_of(reference, list(ids) + list(expected[:first]))[-1]
                gap = float(r[expected[first]] - r[out[first]])
            rows.append({"prompt": name[:40], "max_abs_logit_diff": diff, "first_divergence": first,
                         "reference_gap_there": gap})
        report["configs"][label] = {"summary": llm.engine.quantization.summary() if llm.engine.quantization else
                                    "dense", "token_identical": f"{identical}/{len(prompts)}",
                                    "max_abs_logit_diff": worst, "seconds": time.perf_counter() - start,
                                    "rows": rows}
        print(f"{label:<11} {report['configs'][label]['summary']}")
        print(f"            token-identical to dense fp32: {identical}/{len(prompts)}; max |logit diff| {worst:.3g}")
        for r in rows:
            if r["first_divergence"] is not None:
                print(f"            {r['prompt']!r}: first divergence at token {r['first_divergence']}, "
                      f"reference gap there {r['reference_gap_there']:.3g}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
