"""Where a decode step's time goes in the engine: the decoder stack (C), the head, and the rest (Python).

    Q=a8|"" SET=humaneval|chat python step_time.py none|ngram|suffix
6 prompts x 128 greedy tokens, one LLM.generate call per prompt, 2 threads; prints tok/s and ms per
generated token in the stack (prefill included), in the head (compute_logits) and elsewhere."""
import time, torch, sys, os
torch.set_num_threads(2)
from hyspec import LLM, SamplingParams
from hyspec.bench.prompts import humaneval_prompts, chat_prompts
method = sys.argv[1]
sc = None if method == "none" else {"method": method, "num_speculative_tokens": 4}
llm = LLM(quantization=os.environ.get("Q") or None, speculative_config=sc)
model = llm.engine.model; stack = model.layer_stack
acc = {"stack": 0.0, "n": 0, "head": 0.0, "rows": 0}
orig = stack.run_aux
def timed(h, *a, **k):
    t = time.perf_counter(); r = orig(h, *a, **k); acc["stack"] += time.perf_counter() - t; acc["n"] += 1; acc["rows"] += h.shape[0]; return r
stack.run_aux = timed
origh = model.compute_logits
def th(h, *a, **k):
    t = time.perf_counter(); r = origh(h, *a, **k); acc["head"] += time.perf_counter() - t; return r
model.compute_logits = th
prompts = (chat_prompts(llm.tokenizer.apply_chat_template) if os.environ.get("SET") == "chat" else humaneval_prompts())[:6]
sp = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=8))
for k in acc: acc[k] = 0
t = time.perf_counter(); n = 0
for p in prompts:
    n += len(llm.generate([p], sp)[0].outputs[0].token_ids)
dt = time.perf_counter() - t
print(method, os.environ.get("Q"), f"{n/dt:.1f} tok/s; per token {dt/n*1e3:.2f} ms; forwards {acc['n']} rows {acc['rows']}; stack {acc['stack']/n*1e3:.2f} ms/token; head {acc['head']/n*1e3:.2f} ms/token; rest {(dt-acc['stack']-acc['head'])/n*1e3:.2f} ms/token")
spec = getattr(llm.engine, "spec", None)
if getattr(spec, "controller", None) is not None:  # the goodput controller's view at the end
    c = spec.controller
    print("predict", [round(c.cost_model.predict(1, n) * 1e3, 2) for n in (1, 2, 3, 5, 9)], "host", round(c.host_seconds(1, False)*1e3, 2), round(c.host_seconds(1, True)*1e3, 2))
    for m, st in c._methods.items():
        print(m, "acc", [round(a, 2) for a in st.acceptance], "tree", {b: round(c._tree_estimate(st, b), 2) for b in c.budget_buckets}, "draft", st.draft.coefficients(), "buckets", c.budget_buckets)
