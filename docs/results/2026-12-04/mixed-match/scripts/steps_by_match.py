"""Where a batch-1 pass over the mixed workload spends its steps, by match bucket and chosen arm (a8).

Usage: .venv/bin/python docs/results/2026-12-04/mixed-match/scripts/steps_by_match.py suffix|hyb-s
(hyb-s: the bandit over suffix and plain decoding only).  It wraps SpecDecoder.plan/observe to record,
per step, the match bucket the hybrid's signal would give, the arm, the tokens committed and the wall
time; two passes after a warm-up, the suffix cache and prefix cache emptied before each.
"""
import collections
import sys
import time

from hyspec import LLM, SamplingParams
from hyspec.assets import default_model
from hyspec.bench.workloads import workload_requests
from hyspec.dispatch.bandit import step_class
from hyspec.engine.step import RowKind
from hyspec.model.tokenizer import Tokenizer
from hyspec.spec import decoder as D

model = default_model()
tok = Tokenizer(model)
reqs = workload_requests("mixed", tok.apply_chat_template, 18)
prompts = [tok.encode(t, add_special_tokens=not templ) for t, templ in reqs]
stats = collections.defaultdict(lambda: [0, 0, 0.0])  # (bucket, arm) -> steps, tokens, seconds
cur = {}
orig_plan, orig_observe = D.SpecDecoder.plan, D.SpecDecoder.observe


def plan(self, scheduler):
    decoding = [s for s in scheduler.running if not s.in_prefill]
    cur["k"] = step_class(0, 1, self._match_length(decoding, 16) if decoding else None).split(",")[-1]
    cur["t"] = time.perf_counter()
    result = orig_plan(self, scheduler)
    cur["m"] = result.method
    return result


def observe(self, run, accepted):
    orig_observe(self, run, accepted)
    if run.rows and all(r.kind.decodes for r in run.rows):
        c = sum(len(accepted.tokens.get(r.seq.request_id, ())) if r.kind is RowKind.TREE else 1 for r in run.rows)
        s = stats[(cur["k"], cur["m"])]
        s[0] += 1
        s[1] += c
        s[2] += time.perf_counter() - cur["t"]


D.SpecDecoder.plan, D.SpecDecoder.observe = plan, observe
depth = {"suffix_decoding_max_tree_depth": 64}
cfg = {"suffix": {"method": "suffix", "num_speculative_tokens": 64, **depth},
       "hyb-s": {"method": "hybrid", "num_speculative_tokens": 64, **depth,
                 "hybrid": {"policy": "bandit", "methods": [{"method": "suffix"}]}}}[sys.argv[1]]
llm = LLM(str(model), speculative_config=cfg, quantization="a8", enable_prefix_caching=True)
params = SamplingParams(temperature=0, max_tokens=96, ignore_eos=True)
llm.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
stats.clear()
start, n = time.perf_counter(), 0
for rep in range(2):
    llm.engine.spec.forget_shared_history()
    llm.reset_prefix_cache()
    for p in prompts:
        n += len(llm.generate([p], params)[0].outputs[0].token_ids)
print(sys.argv[1], "tok/s", round(n / (time.perf_counter() - start), 1))
total = sum(v[2] for v in stats.values())
for (bucket, arm), (steps, tokens, sec) in sorted(stats.items()):
    print(f"{bucket:10s} {arm:7s} steps {steps:5d} tokens {tokens:5d} sec {sec:6.2f} ({sec / total:4.0%}) "
          f"tok/step {tokens / steps:5.2f} goodput {tokens / sec:6.1f}")
