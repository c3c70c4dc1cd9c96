"""A/B of the bandit's back-off rule on the real default model: plain, suffix, the bare hybrid (back-off judged on
the explored step and on the arm's estimate plus two standard errors) and the same hybrid with the old rule (judged
on the explored step alone, restored by overriding the policy's _optimistic bound with -inf), engines interleaved
pass by pass, the suffix cache emptied before each pass, 8 prompts x 128 tokens, T=0, batch 1.

    PASSES=3 .venv/bin/python docs/results/2026-12-05/hybrid-backoff-error/ab.py humaneval|chat
"""
import sys, time, json, os, statistics
from hyspec import LLM, SamplingParams
from hyspec.bench.prompts import humaneval_prompts, chat_prompts
wl = sys.argv[1]; passes = int(os.environ.get("PASSES", "3")); n = int(os.environ.get("NPROMPTS", "8"))
cfgs = {"plain": None, "suffix": {"method": "suffix"}, "hybrid-new": {"method": "hybrid"}, "hybrid-old": {"method": "hybrid"}}
llms = {k: LLM(speculative_config=v, kv_cache_bytes=512 << 20) for k, v in cfgs.items()}
pol = llms["hybrid-old"].engine.spec.dispatcher.bandit
pol._optimistic = lambda *a: float("-inf")  # the old rule: an exploring step behind the gap doubles the wait
tok = llms["plain"].tokenizer
prompts = (humaneval_prompts() if wl == "humaneval" else chat_prompts(tok.apply_chat_template))[:n]
sp = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
rates = {k: [] for k in llms}; outs = {}
for p in range(passes):
    for name, llm in llms.items():
        if llm.engine.spec.enabled: llm.engine.spec.forget_shared_history()
        t0 = time.perf_counter(); got = []
        for q in prompts:
            llm.reset_prefix_cache()
            got.append(list(llm.generate([q], sp)[0].outputs[0].token_ids))
        rates[name].append(sum(map(len, got)) / (time.perf_counter() - t0))
        outs.setdefault(name, got)
med = {k: statistics.median(v) for k, v in rates.items()}
for k in llms:
    print(f"{wl} {k:12s} {[round(x,1) for x in rates[k]]} median {med[k]:.1f} x plain {med[k]/med['plain']:.3f} x suffix {med[k]/med['suffix']:.3f} identical {outs[k]==outs['plain']}")
for k in ("hybrid-new", "hybrid-old"):
    d = llms[k].engine.spec.dispatcher.snapshot() if hasattr(llms[k].engine.spec.dispatcher, "snapshot") else None
    b = llms[k].engine.spec.dispatcher.bandit.snapshot()
    ch = {}
    for (kl, arm), c in b.choices.items(): ch[arm] = ch.get(arm, 0) + c
    print(k, "choices", ch)
for llm in llms.values(): llm.close()
