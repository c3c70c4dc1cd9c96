"""A worker that lies about q cannot bias the output: remote drafts are verified as point proposals.

After each first token y1 the liar drafts the second token the target likes least (the smallest
P(y2 | y1) in the support) and reports q(x) = 1e-6 for it.  Verified with that q, the draft is accepted
whenever u * q(x) < p(x): nearly always, so the second token's law is skewed towards the liar's pick.  Verified as a point proposal (accept with
probability p(x), else draw from p with x removed) the output follows the target's law whatever chose x.
With ``remote.trust_worker_q`` the worker's q is used, and the same liar is caught skewing the law.
"""
from __future__ import annotations

import logging

import pytest
import torch

from hyspec import LLM
from hyspec.conformance.distribution import compare, exact_law, sample_through_generate
from hyspec.remote.host import DraftHost
from hyspec.remote.transport import InProcessHandle
from hyspec.seam.proposer import Proposer
from hyspec.seam.tree import DraftTree
from tests.remote.conftest import remote_placement, spec_config

PROMPT = [11, 42, 7, 99, 23, 5, 64]
SAMPLES = 600  # the liar moves the law by tens of points; 600 samples see a few points (power below)
LIE = 1e-6


class LyingProposer(Proposer):
    """Drafts ``picks[last token]`` and claims it drew it with probability ``LIE``."""

    method = "draft_model"

    def __init__(self, picks: dict[int, int], vocab: int):
        self.picks, self.vocab = picks, vocab

    def max_budget(self) -> int:
        return 4

    def propose(self, requests, sampling):
        return [self._lie(r.seq.last_token) for r in requests]

    def _lie(self, last: int) -> DraftTree:
        token = self.picks.get(last, 0)
        q = torch.zeros(1, self.vocab)
        q[0, token] = LIE
        q[0, (token + 1) % self.vocab] = 1 - LIE  # the rest of the mass elsewhere: q still sums to 1
        return DraftTree.chain(last, [token], q, self.vocab)


@pytest.fixture(scope="module")
def law_and_pick(target_dir):
    plain = LLM(str(target_dir), dtype="float32", kv_cache_bytes=16 << 20, max_model_len=64, max_num_seqs=256)
    law = exact_law(plain.engine, PROMPT)
    least_liked: dict[int, int] = {}
    for (y1, y2), p in law.joint12.items():
        if y1 not in least_liked or p < law.joint12[(y1, least_liked[y1])]:
            least_liked[y1] = y2
    return law, least_liked, plain.engine.target.vocab_size


def lied_to(target_dir, draft_dir, picks, vocab, remote):
    handles = lambda engine, spec: [InProcessHandle(lambda: DraftHost(LyingProposer(picks, vocab), vocab))]
    cfg = spec_config(model=draft_dir, k=1, remote={"draft_deadline_ms": 5000, "pipelining": False, **remote})
    with remote_placement(handles):
        return LLM(str(target_dir), dtype="float32", kv_cache_bytes=16 << 20, max_model_len=64, max_num_seqs=256,
                   speculative_config=cfg)


def sample(llm):
    quality = logging.getLogger("hyspec.spec.quality")
    level = quality.level
    quality.setLevel(logging.ERROR)  # the liar is rejected often on purpose
    try:
        samples = sample_through_generate(llm, PROMPT, SAMPLES)
        drafted = llm.engine.spec.metrics.snapshot()["totals"]["draft_tokens"]
    finally:
        quality.setLevel(level)
        llm.engine.spec.close()
    assert drafted >= SAMPLES // 2, f"only {drafted} drafts in {SAMPLES} requests: the liar was barely heard"
    return samples


def test_a_lying_worker_cannot_bias_the_output(target_dir, draft_dir, law_and_pick):
    law, picks, vocab = law_and_pick
    result = compare(sample(lied_to(target_dir, draft_dir, picks, vocab, {})), law)
    print(f"point proposals, lying worker: {result.describe()}")  # shown with -s
    assert result.power <= 0.1, result.describe()
    assert result.passed, result.describe()


def test_trusting_the_worker_lets_the_liar_through(target_dir, draft_dir, law_and_pick):
    """The opt-in does what it says: a lying worker is believed (the test above has the power to see it)."""
    law, picks, vocab = law_and_pick
    samples = sample(lied_to(target_dir, draft_dir, picks, vocab, {"trust_worker_q": True}))
    result = compare(samples, law)
    print(f"trusted q, lying worker: {result.describe()}")  # shown with -s
    assert not result.passed and result.worst > 5, result.describe()
    picked = sum(picks[y1] == y2 for y1, y2, _ in samples) / len(samples)
    exact = sum(law.joint12[(y1, y2)] for y1, y2 in picks.items())
    assert picked > exact + 0.3, (picked, exact)
