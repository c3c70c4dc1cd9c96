"""The hybrid's per-step choices on the bench's mixed workload, for comparing two trees (issue 49).

    PYTHONPATH=<dir holding a 'hyspec' link to the old tree's core/> .venv/bin/python .../choices.py > runs.jsonl
    .venv/bin/python docs/results/2026-12-06/policy-chain/choices.py >> runs.jsonl

Each run prints one line of JSON, so runs.jsonl holds the before run, then the after run.

Runs ``{"method": "hybrid"}`` three times -- with the packaged default rules (``hybrid.policy: "rules"``),
with a rule file whose conditions read every kind of signal (``CUSTOM_RULES``), and bare (the bandit) --
over the first requests of ``hyspec bench``'s mixed workload, all submitted at once to an engine with fewer
slots than requests (so the load fallback engages and lets go, the batch shrinks as requests end, prefills
mix with decodes), greedy, a few tokens each.  Per step
it records what ``SpecDecoder.plan`` returned: method, draft budget, batch size and the reason for a plain
step; then the generated tokens and the rejection counts of the metrics.

Everything that reads the wall clock is made deterministic: ``time.perf_counter`` is replaced, before
hyspec is imported, by a clock that advances 1 ms per call, so the goodput controller's cost model, the
start-up profile and the bandit's reward see the same "times" on every run whenever the code reads the
clock the same number of times per step.  The output is a function of the code alone, and two trees that
decide the same way print the same JSON.
"""
from __future__ import annotations

import itertools
import json
import sys
import tempfile
import time
from pathlib import Path

_ticks = itertools.count(1)
time.perf_counter = lambda: next(_ticks) * 1e-3  # noqa: E731 -- before any hyspec import reads it
time.perf_counter_ns = lambda: next(_ticks) * 1_000_000  # noqa: E731

import hyspec  # noqa: E402
from hyspec import LLM, SamplingParams  # noqa: E402
from hyspec.assets import default_model  # noqa: E402
from hyspec.bench.workloads import workload_requests  # noqa: E402
from hyspec.model.tokenizer import Tokenizer  # noqa: E402
from hyspec.spec import decoder  # noqa: E402

NUM_REQUESTS = 12
MAX_NUM_SEQS = 8  # 12 requests over 8 slots: the load fallback engages while full and lets go as requests end
#: request i generates 8 + 2 * i tokens, so requests end one by one and the batch shrinks step by step
MAX_TOKENS = [8 + 2 * i for i in range(NUM_REQUESTS)]
#: rules that read every kind of signal: match length, a method's acceptance, the batch, a catch-all
CUSTOM_RULES = [
    {"when": "match_length >= 4 and not (batch_size > 6)", "method": "suffix"},
    {"when": "accept_rate.mtp < 0.3 or (context_length / 2 > 300 and -queue_depth < 0)", "method": "ngram"},
    {"when": "batch_size >= 7", "method": "none"},
    {"method": "mtp"},
]
CONFIGS = {
    "rules": {"method": "hybrid", "hybrid": {"policy": "rules"}},  # the packaged default rules
    "custom_rules": {"method": "hybrid", "hybrid": {"rules_path": "<custom>"}},
    "bandit": {"method": "hybrid"},  # a bare hybrid: the bandit over every loaded method and plain decoding
}


def run(config: dict, prompts: list[list[int]]) -> dict:
    steps: list[list] = []
    original = decoder.SpecDecoder.plan

    def plan(self, scheduler):
        p = original(self, scheduler)
        steps.append([p.method, p.budget, p.lookahead, p.batch_size, p.reason])
        return p

    decoder.SpecDecoder.plan = plan
    try:
        llm = LLM(str(default_model()), speculative_config=config, max_num_seqs=MAX_NUM_SEQS)
        params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
        outs = llm.generate(prompts, params)
        metrics = llm.engine.spec.metrics
        rejections = {f"{cause}/{method}": n for (cause, method), n in sorted(_rejections(metrics).items())}
        llm.close()
    finally:
        decoder.SpecDecoder.plan = original
    return {"steps": steps, "tokens": [o.outputs[0].token_ids for o in outs], "rejections": rejections}


def _rejections(metrics) -> dict:
    """(cause, method/arm) -> count: every rejection the speculation metrics recorded."""
    out = {}
    for (method, arm), series in metrics._series.items():
        for cause, n in series.rejections.items():
            if n:
                out[(cause, f"{method}/{arm}")] = n
    return out


def main() -> None:
    model = default_model()
    tok = Tokenizer(model)
    requests = workload_requests("mixed", tok.apply_chat_template, NUM_REQUESTS)
    prompts = [tok.encode(text, add_special_tokens=not rendered) for text, rendered in requests]
    result = {"hyspec": hyspec.__file__, "requests": NUM_REQUESTS, "max_tokens": MAX_TOKENS}
    with tempfile.TemporaryDirectory() as tmp:
        rules = Path(tmp) / "rules.json"
        rules.write_text(json.dumps(CUSTOM_RULES, indent=1))
        for name, config in CONFIGS.items():
            if "hybrid" in config and config["hybrid"].get("rules_path") == "<custom>":
                config = {**config, "hybrid": {**config["hybrid"], "rules_path": str(rules)}}
            print(f"running {name}", file=sys.stderr)
            result[name] = run(config, prompts)
    json.dump(result, sys.stdout, indent=None, separators=(",", ":"))
    print()


if __name__ == "__main__":
    main()
