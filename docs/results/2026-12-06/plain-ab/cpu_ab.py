"""Plain decoding's CPU time per token in one tree (PYTHONPATH picks the tree); 1 thread so that the
process's CPU time, not wall time, is the measure: other jobs on the VM change wall time, much less CPU time."""
import json, sys, time, torch
torch.set_num_threads(1)
from hyspec import LLM, SamplingParams
from hyspec.bench.prompts import humaneval_prompts
mode = sys.argv[1]
prompts = humaneval_prompts()[:4]
spec = None if mode == "plain" else {"method": mode}
llm = LLM(speculative_config=spec) if spec else LLM()
p = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), use_tqdm=False)
res = []
for rep in range(3):
    for pr in prompts:
        c0, w0 = time.process_time(), time.perf_counter()
        out = llm.generate([pr], p, use_tqdm=False)
        c1, w1 = time.process_time(), time.perf_counter()
        res.append({"cpu_ms_per_tok": 1000 * (c1 - c0) / 64, "wall_ms_per_tok": 1000 * (w1 - w0) / 64})
toks = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, p, use_tqdm=False)]
print(json.dumps({"mode": mode, "runs": res, "tokens": toks}))
