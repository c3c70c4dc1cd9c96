"""Plain decoding against the bench's bandit hybrid, passes interleaved in one process (mixed workload, a8).

`hyspec bench` times one configuration after another, so a drift of the VM's speed between them lands
in the ratio; here both engines stay loaded and their passes alternate.  Usage (from the repo root):
    .venv/bin/python docs/results/2026-12-04/mixed-match/scripts/interleaved_plain_vs_hybrid.py BATCH
"""
import sys
import time

from hyspec import LLM, SamplingParams
from hyspec.assets import default_drafter, default_model
from hyspec.bench.hyspec_runs import speculative_config
from hyspec.bench.settings import BenchSettings
from hyspec.bench.workloads import workload_requests
from hyspec.model.tokenizer import Tokenizer

model = default_model()
tok = Tokenizer(model)
reqs = workload_requests("mixed", tok.apply_chat_template, 32)
prompts = [tok.encode(t, add_special_tokens=not templ) for t, templ in reqs]
settings = BenchSettings(speculative_config_extra={"suffix_decoding_max_tree_depth": 64})
spec = speculative_config("hybrid", settings, {"eagle3": default_drafter("eagle3")})
bs = int(sys.argv[1])
params = SamplingParams(temperature=0, max_tokens=96, ignore_eos=True)
llms = {"plain": LLM(str(model), quantization="a8", enable_prefix_caching=True),
        "hybrid": LLM(str(model), quantization="a8", enable_prefix_caching=True, speculative_config=spec)}
for llm in llms.values():  # warm-up
    llm.generate(prompts[:bs], SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
for rep in range(3):
    for name, llm in llms.items():
        if llm.engine.spec.enabled:
            llm.engine.spec.forget_shared_history()
        llm.reset_prefix_cache()
        start, n = time.perf_counter(), 0
        for i in range(0, 32, bs):
            n += sum(len(o.outputs[0].token_ids) for o in llm.generate(prompts[i:i + bs], params))
        print(rep, name, f"{n / (time.perf_counter() - start):.1f} tok/s", flush=True)
