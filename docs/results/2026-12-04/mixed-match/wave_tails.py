"""How much of a batch-4 hybrid pass decodes at less than the full batch (the tail of each wave).

`hyspec bench` runs waves with `llm.generate`: a new wave starts only when the last request of the
previous one finishes, so speculation that finishes some requests early leaves the rest decoding at a
smaller batch.  Usage: .venv/bin/python docs/results/2026-12-04/mixed-match/wave_tails.py
"""
import collections
import time

from hyspec import LLM, SamplingParams
from hyspec.assets import default_drafter, default_model
from hyspec.bench.hyspec_runs import speculative_config
from hyspec.bench.settings import BenchSettings
from hyspec.bench.workloads import workload_requests
from hyspec.model.tokenizer import Tokenizer
from hyspec.spec import decoder as D

BATCH = 4
model = default_model()
tok = Tokenizer(model)
reqs = workload_requests("mixed", tok.apply_chat_template, 32)
prompts = [tok.encode(t, add_special_tokens=not templ) for t, templ in reqs]
spec = speculative_config("hybrid", BenchSettings(speculative_config_extra={"suffix_decoding_max_tree_depth": 64}),
                          {"eagle3": default_drafter("eagle3")})
by_batch = collections.defaultdict(lambda: [0, 0.0, 0])  # running decodes -> steps, seconds, tokens
cur = {}
orig_plan, orig_observe = D.SpecDecoder.plan, D.SpecDecoder.observe


def plan(self, scheduler):
    cur["n"] = len([s for s in scheduler.running if not s.in_prefill])
    cur["t"] = time.perf_counter()
    return orig_plan(self, scheduler)


def observe(self, run, accepted):
    orig_observe(self, run, accepted)
    if run.rows and all(r.kind.decodes for r in run.rows):
        committed = sum(len(accepted.tokens.get(r.seq.request_id, ())) if r.kind.name == "TREE" else 1
                        for r in run.rows)
        b = by_batch[cur["n"]]
        b[0] += 1
        b[1] += time.perf_counter() - cur["t"]
        b[2] += committed


D.SpecDecoder.plan, D.SpecDecoder.observe = plan, observe
llm = LLM(str(model), quantization="a8", enable_prefix_caching=True, speculative_config=spec)
params = SamplingParams(temperature=0, max_tokens=96, ignore_eos=True)
llm.generate(prompts[:BATCH], SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
by_batch.clear()
llm.engine.spec.forget_shared_history()
llm.reset_prefix_cache()
start = time.perf_counter()
for i in range(0, 32, BATCH):
    llm.generate(prompts[i:i + BATCH], params)
wall = time.perf_counter() - start
decode = sum(v[1] for v in by_batch.values())
print(f"pass {wall:.2f} s, decode steps {decode:.2f} s, the rest (prefill, between steps) {wall - decode:.2f} s")
for n in sorted(by_batch):
    steps, sec, tokens = by_batch[n]
    print(f"{n} decoding: {steps:4d} steps {sec:6.2f} s ({sec / wall:4.0%} of the pass) {tokens:5d} tokens "
          f"{tokens / sec:6.1f} tok/s")
