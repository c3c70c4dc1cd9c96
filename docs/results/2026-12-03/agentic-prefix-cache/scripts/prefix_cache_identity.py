import time, sys
from hyspec import LLM, SamplingParams
from hyspec.assets import default_model
from hyspec.bench.workloads import workload_requests
from hyspec.model.tokenizer import Tokenizer
q = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "none" else None
spec = None if len(sys.argv) < 3 else {"method": sys.argv[2]}
model = default_model()
tok = Tokenizer(model)
reqs = workload_requests("agentic", tok.apply_chat_template, 16)
prompts = [tok.encode(t, add_special_tokens=False) for t, _ in reqs]
print("prompt lengths", [len(p) for p in prompts])
p = SamplingParams(temperature=0, max_tokens=96, ignore_eos=True)
res = {}
for pc in (False, True):
    llm = LLM(model, quantization=q, enable_prefix_caching=pc, speculative_config=spec)
    llm.generate(prompts[:2], p)  # warm-up
    llm.reset_prefix_cache()
    t = time.perf_counter()
    outs = []
    for pr in prompts:  # batch 1, in order
        outs += llm.generate([pr], p)
    dt = time.perf_counter() - t
    res[pc] = [list(o.outputs[0].token_ids) for o in outs]
    pcache = llm.engine.prefix_cache
    print(f"prefix_caching={pc}: {16*96/dt:.1f} tok/s, ttft {[round(o.metrics.ttft*1000) for o in outs]}",
          pcache and (pcache.stats, len(pcache)))
    llm.close(); del llm
print("identical:", res[False] == res[True], sum(a == b for a, b in zip(res[False], res[True])), "/16")
