"""hyspec's hybrid against hyspec's plain decoding, interleaved in one process, first pass only.

    .venv/bin/python scripts/hybrid_ab.py [--workloads humaneval,chat] [--batch-sizes 1,8,32]
        [--rounds 3] [--max-tokens 48] [--prompts 32] [--hybrid-config JSON] [--before] [--trace]
        [--engine NAME=JSON ...] --json OUT.json

The engines stay loaded.  For each (workload, batch size) and round, plain runs the round's prompts and then
the hybrid runs the same ones (the order reverses every round, so a slow-down in the middle lands on all).
Each round takes the next ``--prompts`` prompts of the workload (HumanEval has 164; the 16 chat turns are
cycled), and before every pass the engines forget what they learnt across requests (the suffix cache) and
the prefix cache is emptied: every pass is a *first* pass, as ``hyspec bench`` measures it.  What the
hybrid's policy learnt (its bandit, the cost model, the acceptance estimates) is kept from pass to pass, as
a server keeps it.  Greedy, EOS ignored; the hybrid's tokens are compared with plain decoding's.

``--before`` adds a third engine, "hybrid-before": the same hybrid with the goodput controller's acceptance
estimates as they were before 2026-12-06 (per-position EWMAs decaying from the optimistic prior, every
unmeasured tree bucket at its prior), so the change is measured before/after in the same interleaved run.

``--engine NAME=JSON`` (repeatable) adds an engine with that speculative_config, interleaved with the others and
compared with plain decoding like the hybrid: e.g. ``--engine 'suffix-no-wave={"method": "suffix", "controller":
{"wave_makespan": false}}'`` measures a policy option on and off in one run.

``--trace`` records, for the hybrid, every decode step: the arm the dispatcher chose, the budget, the draft
nodes verified, the tokens committed, the forward's measured and predicted seconds, the drafting seconds and
the whole ``engine.step`` time; and for plain, the ``engine.step`` time.  The JSON then carries, per
(workload, batch), a summary of those steps: where the hybrid's time went against plain decoding's.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from typing import Any


def _cycle(items: list, start: int, count: int) -> list:
    return [items[(start + i) % len(items)] for i in range(count)]


class StepTrace:
    """Wraps one engine's ``step`` (and, with speculation, its plan / draft / observe) to record each step."""

    def __init__(self, llm: Any):
        self.engine = llm.engine
        self.spec = self.engine.spec if getattr(self.engine.spec, "enabled", False) else None
        self.rows: list[dict[str, Any]] = []
        self._current: dict[str, Any] | None = None
        step = self.engine.step

        def traced_step():
            self._current = {}
            t0 = time.perf_counter()
            out = step()
            if self._current.get("decode"):
                self._current["step_s"] = time.perf_counter() - t0
                self.rows.append(self._current)
            self._current = None
            return out

        self.engine.step = traced_step
        if self.spec is None:
            run_target = self.engine._run_target

            def traced_run(scheduled, drafts):
                run, drafts = run_target(scheduled, drafts)
                if self._current is not None and run.rows and all(r.kind.decodes for r in run.rows):
                    self._current.update(decode=True, batch=len(run.feeds), forward_s=run.seconds)
                return run, drafts

            self.engine._run_target = traced_run
            return
        spec, controller = self.spec, self.spec.controller
        plan, observe = spec.plan, spec.observe

        def traced_plan(scheduler):
            p = plan(scheduler)
            if self._current is not None:
                self._current.update(method=p.method, budget=p.budget, reason=p.reason,
                                     plan_s=time.perf_counter() - p.started)
            return p

        def traced_observe(run, accepted):
            t0 = time.perf_counter()
            if self._current is not None and run.rows and all(r.kind.decodes for r in run.rows):
                from hyspec.seam.step import RowKind
                from hyspec.spec.decoder import mean_tokens_per_seq
                batch, tokens = len(run.feeds), mean_tokens_per_seq(run.feeds)
                tree_rows = [r for r in run.rows if r.kind is RowKind.TREE]
                committed = sum(len(accepted.tokens.get(r.seq.request_id, ())) if r.kind is RowKind.TREE else 1
                                for r in run.rows)
                self._current.update(decode=True, batch=batch, tokens_per_seq=tokens, forward_s=run.seconds,
                                     predicted_forward_s=controller.cost_model.predict(batch, tokens),
                                     draft_s=accepted.draft_seconds, verified_seqs=len(tree_rows),
                                     committed=committed)
            observe(run, accepted)
            if self._current is not None:
                self._current["observe_s"] = time.perf_counter() - t0

        spec.plan, spec.observe = traced_plan, traced_observe

    def take(self) -> list[dict[str, Any]]:
        rows, self.rows = self.rows, []
        return rows


def use_estimates_before(llm: Any) -> None:
    """Swap the engine's goodput controller to the acceptance estimates of before 2026-12-06 (see above)."""
    from hyspec.policy.controller import GoodputController

    class EstimatesBefore(GoodputController):
        def _old(self, st):
            if not hasattr(st, "old"):
                st.old = [self.prior] * self.max_tokens
            return st.old

        def _acceptance(self, st, positions=None):
            return list(self._old(st)[:positions])

        def observe_acceptance(self, method, accepted_per_position, num_drafts, drafted_per_position=None):
            old = self._old(self._state(method))
            reached = num_drafts
            for j, accepted in enumerate(accepted_per_position[:len(old)]):
                denom = reached if drafted_per_position is None else min(reached, drafted_per_position[j])
                if denom > 0:
                    old[j] += self.alpha * (accepted / denom - old[j])
                reached = accepted

        def _tree_estimate(self, st, bucket):
            weight = st.tree_weight.get(bucket, 0.0)
            return st.tree_accepted[bucket] / weight if weight > 0.0 else self._tree_prior(bucket)

    llm.engine.spec.controller.__class__ = EstimatesBefore


def _pass_counts(llm: Any) -> dict[str, int]:
    """The engine's steps so far (counted by a wrapper installed on first use) and its speculation totals."""
    engine = llm.engine
    if not hasattr(engine, "_ab_steps"):
        engine._ab_steps = 0
        step = engine.step

        def counted_step():
            engine._ab_steps += 1
            return step()

        engine.step = counted_step
    spec = engine.spec if getattr(engine.spec, "enabled", False) else None
    totals = spec.metrics.snapshot()["totals"] if spec is not None else {}
    return {"steps": engine._ab_steps, "draft_tokens": totals.get("draft_tokens", 0),
            "accepted_tokens": totals.get("accepted_tokens", 0)}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (method, drafted or not): steps, mean step / forward / draft / plan / observe ms, tokens a step,
    and the forward's measured over predicted seconds."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        drafted = r.get("verified_seqs", 0) > 0
        groups[f"{r.get('method', 'plain')} {'drafted' if drafted else 'no-draft'}"].append(r)
    out = {}
    for key, rs in sorted(groups.items()):
        def mean_ms(name: str) -> float | None:
            vals = [r[name] for r in rs if r.get(name) is not None]
            return round(1e3 * statistics.fmean(vals), 3) if vals else None
        ratio = [r["forward_s"] / r["predicted_forward_s"] for r in rs if r.get("predicted_forward_s")]
        out[key] = {"steps": len(rs), "step_ms": mean_ms("step_s"), "forward_ms": mean_ms("forward_s"),
                    "draft_ms": mean_ms("draft_s"), "plan_ms": mean_ms("plan_s"), "observe_ms": mean_ms("observe_s"),
                    "committed_per_step": round(statistics.fmean(r.get("committed", r.get("batch", 1))
                                                                 for r in rs), 3),
                    "forward_measured_over_predicted": round(statistics.fmean(ratio), 3) if ratio else None}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="humaneval,chat")
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--prompts", type=int, default=None,
                    help="prompts per round (default: max(8, batch size), one wave at batch >= 8)")
    ap.add_argument("--hybrid-config", default='{"method": "hybrid"}',
                    help="the hybrid's speculative_config, JSON (default: the bare hybrid, the bandit over ngram, "
                         "suffix and every drafter in assets/)")
    ap.add_argument("--kv-cache-bytes", type=int, default=512 << 20)
    ap.add_argument("--trace", action="store_true", help="record and summarise every decode step (see above)")
    ap.add_argument("--before", action="store_true", help="a third engine with the controller's estimates of before "
                                                          "2026-12-06 (see above)")
    ap.add_argument("--engine", action="append", default=[], metavar="NAME=JSON",
                    help="one more engine with this speculative_config (repeatable; see above)")
    ap.add_argument("--json", required=True)
    args = ap.parse_args(argv)
    workloads = [w for w in args.workloads.split(",") if w]
    batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    if args.rounds < 1 or not batch_sizes or min(batch_sizes) < 1 or not workloads:
        ap.error("need workloads, batch sizes >= 1 and rounds >= 1")
    unknown = [w for w in workloads if w not in ("humaneval", "chat")]
    if unknown:
        ap.error(f"unknown workload {unknown[0]!r}: humaneval or chat")

    from hyspec import LLM, SamplingParams
    from hyspec.bench.prompts import chat_prompts, humaneval_prompts

    t_start = time.time()
    engines = {"plain": LLM(kv_cache_bytes=args.kv_cache_bytes),
               "hybrid": LLM(speculative_config=json.loads(args.hybrid_config), kv_cache_bytes=args.kv_cache_bytes)}
    if args.before:
        engines["hybrid-before"] = LLM(speculative_config=json.loads(args.hybrid_config),
                                       kv_cache_bytes=args.kv_cache_bytes)
        use_estimates_before(engines["hybrid-before"])
    for spec in args.engine:
        name, sep, config = spec.partition("=")
        if not sep or not name or name in engines:
            ap.error(f"--engine {spec!r}: NAME=JSON with a new name")
        engines[name] = LLM(speculative_config=json.loads(config), kv_cache_bytes=args.kv_cache_bytes)
    traces = {name: StepTrace(llm) for name, llm in engines.items()} if args.trace else {}
    tokenizer = engines["plain"].tokenizer
    texts = {"humaneval": humaneval_prompts(), "chat": chat_prompts(tokenizer.apply_chat_template)}
    ids = {w: [tokenizer.encode(t, add_special_tokens=(w != "chat")) for t in texts[w]] for w in workloads}
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    warm = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    for llm in engines.values():  # lazy initialisation and first-call allocations are not timed
        llm.generate([ids[workloads[0]][0]], warm, use_tqdm=False)
    for trace in traces.values():
        trace.take()

    results: list[dict[str, Any]] = []
    mismatches = 0
    for workload in workloads:
        offset = 0
        for bs in batch_sizes:
            n = args.prompts or max(8, bs)
            rates: dict[str, list[float]] = {name: [] for name in engines}
            # per pass: engine steps, draft tokens verified and accepted -- what a policy changes, without the
            # machine's noise that the rates carry
            counts: dict[str, list[dict[str, int]]] = {name: [] for name in engines}
            steps: dict[str, list[dict[str, Any]]] = {name: [] for name in engines}
            for rnd in range(args.rounds):
                prompts = _cycle(ids[workload], offset, n)
                offset += n
                waves = [prompts[i:i + bs] for i in range(0, n, bs)]
                order = list(engines) if rnd % 2 == 0 else list(reversed(engines))  # drift lands on every engine
                outputs: dict[str, list[list[int]]] = {}
                for name in order:
                    llm = engines[name]
                    llm.engine.spec.forget_shared_history()
                    llm.reset_prefix_cache()
                    before = _pass_counts(llm)
                    t0 = time.perf_counter()
                    outs = [list(o.outputs[0].token_ids) for wave in waves
                            for o in llm.generate(wave, params, use_tqdm=False)]
                    rates[name].append(sum(map(len, outs)) / (time.perf_counter() - t0))
                    counts[name].append({k: v - before[k] for k, v in _pass_counts(llm).items()})
                    outputs[name] = outs
                    if name in traces:
                        steps[name] += traces[name].take()
                diff = sum(a != b for name in engines if name != "plain"
                           for a, b in zip(outputs["plain"], outputs[name]))
                mismatches += diff
                print(f"{workload} bs {bs} round {rnd + 1}: " + ", ".join(
                    f"{name} {rates[name][-1]:.1f} ({counts[name][-1]['steps']} steps, "
                    f"{counts[name][-1]['draft_tokens']} drafted)" for name in order)
                    + f" tok/s, {diff} outputs differ from plain's",
                    flush=True)
            med = {name: statistics.median(r) for name, r in rates.items()}
            over_plain = {name: round(statistics.median(h / p for h, p in zip(rates[name], rates["plain"])), 3)
                          for name in engines if name != "plain"}
            entry: dict[str, Any] = {"workload": workload, "batch_size": bs, "prompts_per_round": n,
                                     "tok_s": rates, "median_tok_s": med, "per_pass_counts": counts,
                                     "over_plain_median_of_paired_rounds": over_plain}
            if traces:
                entry["steps"] = {name: summarize(rows) for name, rows in steps.items()}
            spec = engines["hybrid"].engine.spec
            dispatcher = getattr(spec, "dispatcher", None)
            if dispatcher is not None:
                entry["hybrid_decisions_so_far"] = dict(dispatcher.snapshot().decisions)
            results.append(entry)
            print("  -> x plain: " + ", ".join(f"{name} {r:.3f}" for name, r in over_plain.items()), flush=True)

    report = {"what": "hyspec hybrid vs hyspec plain, interleaved in one process, first passes only",
              "command": " ".join(sys.argv), "max_tokens": args.max_tokens, "rounds": args.rounds,
              "hybrid_config": json.loads(args.hybrid_config),
              "engines": {name: llm.engine.spec.config.to_dict() if getattr(llm.engine.spec, "enabled", False) else None
                          for name, llm in engines.items()},
              "outputs_differing": mismatches,
              "wall_s": round(time.time() - t_start, 1), "results": results}
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)
    for llm in engines.values():
        llm.close()
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
