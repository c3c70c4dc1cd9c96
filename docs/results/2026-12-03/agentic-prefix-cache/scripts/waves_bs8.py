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
llm.generate(prompts[:8], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
llm.reset_prefix_cache(); 
if spec: llm.engine.spec.forget_shared_history()
for wave in (prompts[:8], prompts[8:]):
    t = time.perf_counter(); llm.generate(wave, p); dt = time.perf_counter() - t
    print(f"{sys.argv[1][:30]} {8*96/dt:.1f} tok/s", flush=True)
if spec:
    snap = llm.engine.spec.metrics.snapshot()["totals"]
    print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in snap.items() if not isinstance(v, (list, dict))})
    print(snap.get("rejections"))
    c = llm.engine.spec.controller
    print("draft cost", c._state("suffix").draft.coefficients(), "host", c._host)
    for b in (1, 8): print(b, [round(c.cost_model.predict(b, n) * 1000, 1) for n in (1, 2, 5, 9, 17, 25)])
    print("budget now", c.choose_scored_budget("suffix", 8))
