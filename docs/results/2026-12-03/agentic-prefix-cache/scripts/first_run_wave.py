import time, sys, json
from hyspec import LLM, SamplingParams
from hyspec.assets import default_model
from hyspec.bench.workloads import workload_requests
from hyspec.model.tokenizer import Tokenizer
model = default_model(); tok = Tokenizer(model)
reqs = workload_requests("agentic", tok.apply_chat_template, 16)
prompts = [tok.encode(t, add_special_tokens=False) for t, _ in reqs]
p = SamplingParams(temperature=0, max_tokens=96, ignore_eos=True)
spec = json.loads(sys.argv[1]) if sys.argv[1] != "none" else None
llm = LLM(model, quantization="a8", enable_prefix_caching=True, speculative_config=spec)
llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
for rep in range(int(sys.argv[2]) if len(sys.argv) > 2 else 1):
    llm.reset_prefix_cache(); llm.engine.spec.forget_shared_history()
    t = time.perf_counter()
    for pr in prompts[:8]:
        llm.generate([pr], p)
    dt = time.perf_counter() - t
    print(f"{spec and spec['method']}: first-run wave {8*96/dt:.1f} tok/s", flush=True)
