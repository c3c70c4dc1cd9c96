"""Replay a workload's greedy outputs through two suffix-decoding drafters: hyspec's and ArcticInference's.

Issue 16 asks whether ArcticInference's suffix tree (package ``arctic-inference``, C++ behind
nanobind) should be hyspec's suffix drafter.  At temperature 0 the tokens a step accepts depend
only on the draft and on the target's greedy output, so both drafters are measured on the same
recorded outputs, step by step, with no model in the loop:

1. plain greedy decoding of the workload's requests with hyspec (``--max-tokens`` each, EOS ignored as
   ``hyspec bench`` does), in the bench's order (agentic repeats after their originals);
2. per drafter, each request is replayed in that order: at every step the drafter proposes a tree
   for the context so far, the step commits the longest accepted path plus the target's token, and
   the finished response joins the drafter's shared cache.

Reported per drafter: target steps, mean accepted tokens per step, mean draft nodes per step (the
rows a verification pays for) and the proposer's time per step.  Both use vLLM's defaults
(max_tree_depth 24, max_spec_factor 1.0, min_token_prob 0.1, tree speculation) unless told.

    .venv/bin/python scripts/suffix_replay.py --workload agentic --num-prompts 16 --max-tokens 96 \\
        --out docs/results/2026-12-02/suffix/replay-agentic.json

ArcticInference is imported from ``--arctic-python``'s environment when it is not importable here
(it needs its own build: see docs/results/2026-12-02/suffix/README.md); without it only hyspec's is
replayed and the JSON says so.
"""
from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace


def accepted_length(tokens: list[int], parents: list[int], target: list[int]) -> int:
    """How many of ``target``'s tokens the tree accepts: the longest root path spelling its prefix.
    ``parents[i]`` is the index (into ``tokens``) of node i's parent, -1 for a child of the root."""
    children: dict[int, dict[int, int]] = {}
    for i, (tok, par) in enumerate(zip(tokens, parents)):
        children.setdefault(par, {}).setdefault(tok, i)
    node, n = -1, 0
    for tok in target:
        nxt = children.get(node, {}).get(tok)
        if nxt is None:
            break
        node, n = nxt, n + 1
    return n


def replay(requests: list[tuple[list[int], list[int]]], propose, finish) -> dict:
    """``propose(i, context) -> (tokens, parents)``; ``finish(i, prompt, output)`` after request i."""
    steps = accepted = nodes = 0
    seconds = 0.0
    seen: set[tuple[int, ...]] = set()
    by_kind = {"first": [0, 0], "repeat": [0, 0]}  # tokens, steps: requests seen for the first time / again
    for i, (prompt, output) in enumerate(requests):
        kind = by_kind["repeat" if tuple(prompt) in seen else "first"]
        seen.add(tuple(prompt))
        steps_before = steps
        pos = 0
        while pos < len(output):
            t0 = time.perf_counter()
            tokens, parents = propose(i, prompt, output[:pos])
            seconds += time.perf_counter() - t0
            n = accepted_length(tokens, parents, output[pos:])
            n = min(n, len(output) - pos - 1)  # the last token is the target's own
            steps, accepted, nodes, pos = steps + 1, accepted + n, nodes + len(tokens), pos + n + 1
        finish(i, prompt, output)
        kind[0] += len(output)
        kind[1] += steps - steps_before
    return {"steps": steps, "tokens": sum(len(o) for _, o in requests),
            "tokens_per_step": round(sum(len(o) for _, o in requests) / steps, 3),
            "accepted_per_step": round(accepted / steps, 3), "draft_nodes_per_step": round(nodes / steps, 3),
            "propose_us_per_step": round(1e6 * seconds / steps, 1),
            "tokens_per_step_by_kind": {k: round(t / n, 3) for k, (t, n) in by_kind.items() if n}}


def hyspec_drafter(args) -> tuple:
    from hyspec.drafters.suffix.proposer import SuffixProposer, SuffixSettings
    from hyspec.seam.proposer import DraftRequest

    prop = SuffixProposer(SuffixSettings(max_tree_depth=args.max_tree_depth, max_cached_requests=args.max_cached,
                                         max_spec_factor=args.max_spec_factor, min_token_prob=args.min_token_prob),
                          max_tokens=args.max_tree_depth, vocab_size=1 << 20)

    def seq(i, prompt, output):
        ids = prompt + output
        return SimpleNamespace(request_id=str(i), token_ids=ids, output_token_ids=output, last_token=ids[-1])

    def propose(i, prompt, output):
        tree = prop.propose([DraftRequest(seq(i, prompt, output), args.max_tree_depth)], None)[0]
        if tree is None:
            return [], []
        return tree.tokens[1:].tolist(), [p - 1 for p in tree.parents[1:].tolist()]

    return propose, lambda i, prompt, output: prop.on_finish(seq(i, prompt, output))


ARCTIC_WORKER = r"""
import json, sys, time
from arctic_inference.suffix_decoding import SuffixDecodingCache
cfg, requests = json.load(sys.stdin)
cache = SuffixDecodingCache(max_tree_depth=cfg["depth"], max_cached_requests=cfg["cached"])
steps = accepted = nodes = 0
seconds = 0.0
seen, by_kind = set(), {"first": [0, 0], "repeat": [0, 0]}
for i, (prompt, output) in enumerate(requests):
    kind = by_kind["repeat" if tuple(prompt) in seen else "first"]
    seen.add(tuple(prompt))
    steps_before = steps
    cache.start_request(i, prompt)
    pos = 0
    while pos < len(output):
        context = prompt + output[:pos]
        t0 = time.perf_counter()
        d = cache.speculate(i, context, max_spec_tokens=cfg["depth"], max_spec_factor=cfg["factor"],
                            min_token_prob=cfg["min_prob"], use_tree_spec=True)
        seconds += time.perf_counter() - t0
        children = {}
        for k, (tok, par) in enumerate(zip(d.token_ids, d.parents)):
            children.setdefault(par, {}).setdefault(tok, k)
        node, n = -1, 0
        for tok in output[pos:]:
            nxt = children.get(node, {}).get(tok)
            if nxt is None:
                break
            node, n = nxt, n + 1
        n = min(n, len(output) - pos - 1)
        cache.add_active_response(i, output[pos:pos + n + 1])
        steps, accepted, nodes, pos = steps + 1, accepted + n, nodes + len(d.token_ids), pos + n + 1
    cache.stop_request(i)
    kind[0] += len(output)
    kind[1] += steps - steps_before
total = sum(len(o) for _, o in requests)
print(json.dumps({"steps": steps, "tokens": total, "tokens_per_step": round(total / steps, 3),
                  "accepted_per_step": round(accepted / steps, 3), "draft_nodes_per_step": round(nodes / steps, 3),
                  "propose_us_per_step": round(1e6 * seconds / steps, 1),
                  "tokens_per_step_by_kind": {k: round(t / n, 3) for k, (t, n) in by_kind.items() if n}}))
"""


def arctic_replay(args, requests) -> dict | None:
    """ArcticInference's SuffixDecodingCache, driven as vLLM drives it (speculate, add the accepted
    tokens to the active response, stop), in ``--arctic-python``'s interpreter."""
    cfg = {"depth": args.max_tree_depth, "cached": args.max_cached, "factor": args.max_spec_factor,
           "min_prob": args.min_token_prob}
    run = subprocess.run([args.arctic_python, "-c", ARCTIC_WORKER], input=json.dumps([cfg, requests]),
                         capture_output=True, text=True)
    if run.returncode != 0:
        print(run.stderr[-2000:], file=sys.stderr)
        return None
    return json.loads(run.stdout.strip().splitlines()[-1])


def record_outputs(args) -> list[tuple[list[int], list[int]]]:
    from hyspec import LLM, SamplingParams
    from hyspec.assets import default_model
    from hyspec.bench.workloads import workload_requests
    from hyspec.model.tokenizer import Tokenizer

    tokenizer = Tokenizer(default_model())
    reqs = workload_requests(args.workload, tokenizer.apply_chat_template, args.num_prompts)
    prompts = [tokenizer.encode(text, add_special_tokens=not templated) for text, templated in reqs]
    with LLM() as llm:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                            SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True),
                            use_tqdm=False)
    return [(p, list(o.outputs[0].token_ids)) for p, o in zip(prompts, outs)]


def machine() -> str:
    from hyspec.backends.cpuinfo import read_cpu_facts

    cpu = read_cpu_facts()
    family = re.search(r"cpu family\s*:\s*(\d+)\s*\nmodel\s*:\s*(\d+)", Path("/proc/cpuinfo").read_text()) \
        if Path("/proc/cpuinfo").exists() else None
    fm = f" (family {family[1]} model {family[2]})" if family else ""
    return f"{cpu.model_name or platform.processor() or platform.machine()}{fm}, {cpu.logical_cores} cores"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="agentic")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--max-tree-depth", type=int, default=24)
    ap.add_argument("--max-cached", type=int, default=10000)
    ap.add_argument("--max-spec-factor", type=float, default=1.0)
    ap.add_argument("--min-token-prob", type=float, default=0.1)
    ap.add_argument("--arctic-python", default=sys.executable,
                    help="an interpreter that can import arctic_inference (default: this one)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    t0 = time.perf_counter()
    requests = record_outputs(args)
    decode_s = time.perf_counter() - t0
    propose, finish = hyspec_drafter(args)
    result = {"workload": args.workload, "num_prompts": args.num_prompts, "max_tokens": args.max_tokens,
              "settings": {"max_tree_depth": args.max_tree_depth, "max_cached_requests": args.max_cached,
                           "max_spec_factor": args.max_spec_factor, "min_token_prob": args.min_token_prob},
              "machine": machine(), "plain_decode_s": round(decode_s, 1),
              "hyspec": replay(requests, propose, finish), "arctic_inference": arctic_replay(args, requests)}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
