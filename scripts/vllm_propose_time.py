"""hyspec's ``propose`` time per vLLM step, without vLLM: the proposer as vLLM's model runner calls it.

    .venv/bin/python scripts/vllm_propose_time.py MODEL_DIR [--batch-sizes 8,32] [--workloads chat,agentic]

vLLM's CPU build runs the proposer in its engine-core process, pinned to one core, so every millisecond here is
added to the step.  The bench's prompts (hyspec.bench.workloads, the first 8, cycled to the batch size) grow by one
token a step (a token of the row's own context: text-like repeats), 48 steps; the hybrid runs with ``min_gain`` 10
and no exploration, so it does all its work (every arm drafts every row, the plan is made) and sends nothing: the
auto-off's cost.  ``--compare`` also times prompt lookup as it was before the one-pass match (a sliding-window pass
per n, hyspec.drafters.ngram.proposer.find_continuation), interleaved run by run.  Prints the median ms per call.
"""
from __future__ import annotations

import argparse
import random
import statistics
from types import SimpleNamespace

import numpy as np
from hyspec.bench.workloads import workload_requests
from hyspec.drafters.ngram.proposer import find_continuation
from hyspec.model.tokenizer import Tokenizer
from hyspec.vllm import HyspecProposer, VllmOptions
from hyspec.vllm.hybrid import NGRAM_SOURCE, Candidate


def sliding_window_lookup(self: HyspecProposer, context: np.ndarray, budget: int) -> Candidate | None:
    """Prompt lookup before the one-pass match: find_continuation at each n, the longest first."""
    o = self.options
    for n in range(min(o.prompt_lookup_max, len(context) - 1), o.prompt_lookup_min - 1, -1):
        follow = find_continuation(context, n, n, budget)
        if follow:
            return Candidate("ngram", tuple(follow), (1.0,) * len(follow), NGRAM_SOURCE, n)
    return None


class Runner:
    """vLLM's model runner as far as the proposer reads it (its input batch's request ids and prompt lengths)."""

    def __init__(self, proposer: HyspecProposer, prompts: list[list[int]]):
        self.proposer = proposer
        self.input_batch = SimpleNamespace(req_ids=[f"r{i}" for i in range(len(prompts))],
                                           num_prompt_tokens=np.array([len(p) for p in prompts]))

    def propose_draft_token_ids(self, sampled: list[list[int]], lengths: np.ndarray, tokens: np.ndarray) -> None:
        self.proposer.propose(sampled, lengths, tokens)


def ms_per_call(prompts: list[list[int]], steps: int) -> float:
    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=4),
                             model_config=SimpleNamespace(max_model_len=4096),
                             scheduler_config=SimpleNamespace(max_num_seqs=256))
    proposer = HyspecProposer(config, VllmOptions(method="hybrid", min_gain=10.0, explore_interval=0))
    tokens = np.zeros((len(prompts), 4096), dtype=np.int32)
    lengths = np.array([len(p) for p in prompts], dtype=np.int32)
    for i, p in enumerate(prompts):
        tokens[i, :len(p)] = p
    runner, rng, sampled = Runner(proposer, prompts), random.Random(0), [[] for _ in prompts]
    for _ in range(steps):
        runner.propose_draft_token_ids(sampled, lengths, tokens)
        sampled = []
        for i in range(len(prompts)):
            t = int(tokens[i, rng.randrange(lengths[i])])
            tokens[i, lengths[i]] = t
            lengths[i] += 1
            sampled.append([t])
    return 1e3 * proposer.stats["propose_seconds"] / proposer.stats["propose_calls"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="the target's tokenizer directory (hyspec export-hf)")
    p.add_argument("--batch-sizes", default="8,32")
    p.add_argument("--workloads", default="chat,agentic")
    p.add_argument("--steps", type=int, default=48)
    p.add_argument("--runs", type=int, default=4)
    p.add_argument("--compare", action="store_true", help="also the sliding-window prompt lookup, interleaved")
    a = p.parse_args()
    tok = Tokenizer(a.model)
    one_pass = HyspecProposer._ngram_candidate
    variants = {"one-pass": one_pass, **({"sliding-window": sliding_window_lookup} if a.compare else {})}
    for workload in a.workloads.split(","):
        texts = workload_requests(workload, tok.apply_chat_template, 8)
        base = [tok.encode(t, add_special_tokens=not templated) for t, templated in texts]
        for batch in map(int, a.batch_sizes.split(",")):
            prompts = [base[i % len(base)] for i in range(batch)]
            times: dict[str, list[float]] = {name: [] for name in variants}
            for run in range(a.runs):
                for name in (list(variants) if run % 2 == 0 else list(reversed(variants))):
                    HyspecProposer._ngram_candidate = variants[name]
                    times[name].append(ms_per_call(prompts, a.steps))
            HyspecProposer._ngram_candidate = one_pass
            print(f"{workload} batch {batch}: propose ms per call, " +
                  ", ".join(f"{name} {statistics.median(v):.2f}" for name, v in times.items()), flush=True)


if __name__ == "__main__":
    main()
