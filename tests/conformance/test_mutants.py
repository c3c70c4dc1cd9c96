"""Bugs the correctness checks must catch: each mutant, enabled here only, makes an identity or law check fail.

* an accept-if-within-eps greedy verifier (eps = half the old blanket bf16 bound), fed by a drafter
  that always proposes the target's runner-up: it flips tokens only where the logits nearly tie, which
  the old first-divergence rule excused; the teacher-forced check counts every flip and fails on the
  near-tie rate, which rises far above plain decoding's;
* the target keeping the KV entry of the first rejected draft token (a stale entry for a token never
  emitted): greedy identity fails with mismatches;
* verification drawing from the target's unprocessed probabilities (temperature, top-k and top-p
  ignored): the engine-level law check fails.

Each mutant's test also runs the same check without the mutant, so a check that fails on everything
would be caught too.
"""
from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from hyspec import LLM, SamplingParams
from hyspec.conformance.identity import excess_near_ties, judge_outputs, measure_rule
from hyspec.conformance.methods import CONTROLLER_OFF, MethodSettings, check_method
from hyspec.conformance.tiny import prompts
from hyspec.numerics import tolerance_for
from hyspec.seam.proposer import Proposer
from hyspec.seam.tree import DraftTree
from tests.conformance.conftest import assert_passed

NUM_PROMPTS, MAX_TOKENS = 8, 32


@pytest.fixture(autouse=True)
def quiet_quality_monitor():
    log = logging.getLogger("hyspec.spec.quality")
    level = log.level
    log.setLevel(logging.ERROR)
    yield
    log.setLevel(level)


# -- mutant 1: accept within eps of the best ------------------------------------------------------------

def eps_verify_greedy(target_logits, trees):
    """verify_greedy, except a draft also passes when its logit is within eps of the best at its parent."""
    b, n = trees.batch_size, trees.max_nodes
    rows = torch.arange(b)
    packed = trees.packed_index.clamp(min=0)
    logits = target_logits.float()
    top = logits.max(-1).values  # [T]
    tol = tolerance_for(torch.bfloat16)
    eps = 0.5 * (tol.absolute + tol.relative * top.abs())  # half the old blanket bound
    parent_rows = packed.gather(1, trees.parents.clamp(min=0))  # [B, N] packed row of each node's parent
    draft_logit = logits[parent_rows, trees.tokens]
    matches = (draft_logit >= top[parent_rows] - eps[parent_rows]) & trees.valid
    matches[:, 0] = True
    reachable = ~(trees.ancestors & ~matches[:, None, :]).any(dim=-1) & trees.valid
    idx = torch.arange(n)
    last = torch.where(reachable, trees.depths * (n + 1) + (n - idx), -1).argmax(dim=1)
    return last, logits.argmax(-1)[packed[rows, last]]


class RunnerUpProposer(Proposer):
    """Drafts one token: the target's second choice, from a cache-free forward of the reference model."""

    method = "ngram"

    def __init__(self, model, vocab):
        self.model, self.vocab = model, vocab

    def max_budget(self):
        return 1

    def propose(self, requests, sampling):
        out = []
        with torch.no_grad():
            for req in requests:
                hidden = self.model.forward_dense(torch.tensor([req.seq.token_ids])).hidden[0, -1:]
                second = int(self.model.compute_logits(hidden)[0].topk(2).indices[1])
                out.append(DraftTree.chain(req.seq.last_token, [second], vocab_size=self.vocab))
        return out


def bf16_identity(workspace, monkeypatch, mutant: bool):
    """Runner-up drafts on the tiny target in bf16: (the method's report, plain vs plain's report)."""
    import hyspec.spec.registry as registry
    import hyspec.spec.verify as verify

    reference = workspace.reference_model("bfloat16")
    monkeypatch.setitem(registry.METHODS, "ngram", dataclasses.replace(
        registry.METHODS["ngram"], factory=lambda target, spec, weights: RunnerUpProposer(reference, 320)))
    if mutant:
        monkeypatch.setattr(verify, "verify_greedy", eps_verify_greedy)
    batch = prompts(NUM_PROMPTS)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    kw = dict(dtype="bfloat16", kv_cache_bytes=16 << 20, max_model_len=256)
    plain = LLM(str(workspace.target_dir), **kw)
    spec = LLM(str(workspace.target_dir), **kw, speculative_config={
        **CONTROLLER_OFF, "method": "ngram", "num_speculative_tokens": 1, "prompt_lookup_min": 1,
        "prompt_lookup_max": 1})
    together = [o.outputs[0].token_ids for o in plain.generate(batch, params)]
    alone = [plain.generate([p], params)[0].outputs[0].token_ids for p in batch]
    drafted = [o.outputs[0].token_ids for o in spec.generate(batch, params)]
    assert spec.engine.spec.metrics.snapshot()["totals"]["draft_tokens"] > NUM_PROMPTS * MAX_TOKENS // 2
    rule = measure_rule(plain.engine, batch, together, chunk=2)
    lengths = [MAX_TOKENS] * NUM_PROMPTS
    return (judge_outputs(plain.engine, batch, drafted, rule, lengths),
            judge_outputs(plain.engine, batch, alone, rule, lengths))


def test_runner_up_drafts_are_never_accepted_by_the_real_verifier(workspace, monkeypatch):
    report, plain = bf16_identity(workspace, monkeypatch, mutant=False)
    assert report.passed, report.describe()
    assert excess_near_ties(report, plain) <= 3, (report.describe(), plain.describe())


def test_an_accept_within_eps_verifier_is_caught(workspace, monkeypatch):
    report, plain = bf16_identity(workspace, monkeypatch, mutant=True)
    flipped = [f for f in report.flips if f.gap > 0]
    assert flipped, "the mutant accepted no runner-up: this test would prove nothing"
    excess = excess_near_ties(report, plain)
    assert not report.passed or excess > 3, (
        f"the eps verifier went unnoticed: {report.describe()}; plain: {plain.describe()}; excess {excess:.1f} sd")


# -- mutant 2: a stale KV entry -------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["cpu"])
def test_a_stale_kv_entry_is_caught(target, backend, workspace, monkeypatch):
    from hyspec.spec.decoder import SpecDecoder

    settings = MethodSettings(num_prompts=4, max_tokens=16, single_prompts=1)
    assert_passed(check_method(target, workspace, "ngram", settings))  # the check passes the real code

    def keep_stale_entry(self, seq, num_nodes, kept):
        start = seq.kv.num_tokens - num_nodes
        # the bug: the first rejected draft's entry stays, as if it were the bonus token's
        seq.kv.truncate(start + len(kept) + (1 if len(kept) < num_nodes else 0))

    monkeypatch.setattr(SpecDecoder, "_commit_kv", keep_stale_entry)
    result = check_method(target, workspace, "ngram", settings)
    assert result.status == "fail", result.detail
    assert result.identity["mismatches"] > 0, result.detail


# -- mutant 3: verification sampling from unprocessed probabilities --------------------------------------

def test_a_verifier_sampling_unprocessed_probabilities_is_caught(workspace, monkeypatch):
    from tests.conformance import test_engine_distribution as dist

    plain = dist.engine(workspace)
    prompt = dist.lookup_prompt(plain.engine, prompts(6)[3])
    law = dist.exact_law(plain.engine, prompt)
    import hyspec.spec.verify as verify

    monkeypatch.setattr(verify, "target_probs", lambda logits, sampling, trees: torch.softmax(logits.float(), -1))
    with pytest.raises(AssertionError, match="ngram"):
        dist.run_and_compare(workspace, (law, prompt), "ngram", dist.DEFAULT_SAMPLES)
