"""The goodput controller: how much to draft this step, including nothing.

Goodput is committed tokens per second.  With a_j the probability that draft
position j is accepted given positions 1..j-1 were (per method, an EWMA over
steps), a chain of k drafts commits in expectation

    E[tokens | k] = 1 + sum_{i=1..k} prod_{j<=i} a_j            (the 1: bonus / corrected token)

and costs  draft(b, k) + verify(b, k + 1) + host(b, spec)  seconds for a batch of b, so per sequence

    goodput(k) = E[tokens | k] / (draft(b, k) + verify(b, k + 1) + host(b, spec)),
    goodput(0) = 1 / (verify(b, 1) + host(b, plain)).

``host`` is the rest of a step (planning, tree building, verification and KV commit, sampling),
measured per batch size separately for steps that speculated and steps that did not: on a CPU
where a decode step takes ~9 ms, a speculative step's bookkeeping cost ~1-2 ms more than a
plain one's, and a controller that saw only the forward drafted at a loss on prompts with ~30 %
acceptance.  It is a constant per step, not per token, so it cannot be extrapolated past the
token counts observed (feeding the whole step into the forward's cost model did exactly that).

``choose`` returns the k in [max(1, floor), max_draft_tokens] with the best
goodput if that beats plain decoding by ``min_gain``, else 0.  Acceptance
alone never decides: at a batch size where verify(b, k + 1) >> verify(b, 1)
even a = 0.95 loses, and the answer is 0.  The floor (``min_draft_tokens``)
only restricts *how much* to draft once speculating pays; it never turns
speculation on.

Learning.  Acceptance starts at an optimistic prior so a new method is tried, but the prior counts
for ``PRIOR_STEPS`` steps only: each position's estimate is a bias-corrected EWMA (discounted sums of
accepted and reached drafts, the prior four steps' worth), so a dozen verified steps outweigh it.  An
EWMA that decayed from the prior instead (0.9, alpha 0.05) still read ~0.6 after ten steps of a drafter
accepted 20 % of the time, and deeper positions, reached only when the earlier ones are accepted,
stayed near 0.9: on chat, where no drafter pays, every method the hybrid tried drafted long chains at a
loss for tens of steps.  A position not reached yet borrows the estimate of the position before it
(not the optimistic prior) once that one has evidence.
Estimates move only when drafts are verified, so a method turned off (k = 0)
would keep a stale, low estimate forever, even after the workload changed
(new prompts that repeat themselves, a drafter that warmed up).  So after
``explore_interval`` consecutive plain steps the controller drafts once, at the
length that would be best if acceptance were perfect, as a probe.  It does so
only when perfect acceptance *could* beat plain decoding: when the cost model
says verification itself is too expensive, there is nothing to learn and no
step is spent.  A probe costs one step in ``explore_interval`` (0.4 % at 256).

Trees use the same rule with the tree budget B in place of k; since the
acceptance of a tree depends on its shape, the expected accepted length is
measured per budget bucket (powers of two up to ``tree.budget``) instead of
being derived from per-position rates.  A bucket's estimate is the bias-corrected
EWMA of its steps, so one step of a bucket replaces its optimistic prior; a bucket
not measured yet takes its prior scaled by how the measured buckets did against
theirs (the prior one tree's worth), so on a workload where trees lose, not every
bucket is tried.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from hyspec.errors import HyspecError
from hyspec.policy.cost_model import CostModel, StepSample
from hyspec.policy.draft_sizing import DraftSizer
from hyspec.policy.draft_value import DraftingValue
from hyspec.seam.tree import DraftTree
from hyspec.spec.config import SpeculativeConfig

__all__ = ["GoodputController", "CostModel", "StepSample", "DraftCost"]

#: steps' worth of the acceptance prior in a chain position's estimate.  Simulated at batch 1 on a CPU-like
#: cost (5 verified rows ~1.7 plain steps), 100 steps, 60 seeds: 1 step lost 4 % on code-like acceptance
#: (0.6 then 0.85; one or two unlucky early steps turned drafting off until the next probe), 4 steps
#: matched the old EWMA there (210 vs 212 tok/s) and kept chat-like acceptance (0.2 then 0.4) at 0.99x plain,
#: where the old EWMA from the prior was 0.87x
PRIOR_STEPS = 4.0

logger = logging.getLogger(__name__)


class DraftCost:
    """Draft time of one step as overhead + per_token * tokens drafted (batch total).

    An exponentially weighted least-squares line (weights decay by ``alpha``
    per observation): five running sums, no history.  With a single token
    count observed so far, the line goes through the origin.  Unobserved, a
    draft is free: the optimistic start that lets a new method be tried.
    """

    def __init__(self, alpha: float):
        self.alpha = alpha
        self._w = self._x = self._y = self._xx = self._xy = 0.0

    def observe(self, num_tokens: int, seconds: float) -> None:
        if num_tokens < 0 or not seconds >= 0.0:
            raise HyspecError(f"draft time: need num_tokens >= 0 and seconds >= 0, got {num_tokens}, {seconds}")
        a, x, y = self.alpha, float(num_tokens), float(seconds)
        self._w += a * (1.0 - self._w)
        self._x += a * (x - self._x)
        self._y += a * (y - self._y)
        self._xx += a * (x * x - self._xx)
        self._xy += a * (x * y - self._xy)

    def coefficients(self) -> tuple[float, float]:
        """(overhead seconds, seconds per drafted token)."""
        if self._w == 0.0:
            return 0.0, 0.0
        mx, my = self._x / self._w, self._y / self._w
        mxx, mxy = self._xx / self._w, self._xy / self._w
        var = mxx - mx * mx
        if var > 1e-9 * max(1.0, mxx):
            slope = (mxy - mx * my) / var
            overhead = my - slope * mx
            if slope >= 0.0 and overhead >= 0.0:
                return overhead, slope
        return 0.0, (mxy / mxx if mxx > 0.0 else 0.0)

    def predict(self, num_tokens: int) -> float:
        overhead, per_token = self.coefficients()
        return overhead + per_token * num_tokens


@dataclass
class _MethodState:
    # [max_draft_tokens] per position: discounted accepted / reached drafts (a rate per step), and the
    # discounted weight of the steps that reached it; the estimate is their ratio with the prior as PRIOR_STEPS steps
    accepted: list[float]
    reached: list[float]
    steps: list[int]  # verified steps that reached each position: the prior's weight decays as theirs does
    draft: DraftCost
    # budget bucket -> EWMA of the accepted length and the EWMA's total weight (1 - (1 - alpha)^steps):
    # their ratio is the bias-corrected mean, so a bucket's first step replaces the optimistic prior
    tree_accepted: dict[int, float] = field(default_factory=dict)
    tree_weight: dict[int, float] = field(default_factory=dict)
    tree_count: dict[int, int] = field(default_factory=dict)  # bucket -> trees verified (undiscounted)
    plain_streak: int = 0  # consecutive choose() calls that returned 0


class GoodputController:
    """Chooses the draft length (chains) or tree budget (trees) that maximises committed tokens/s."""

    def __init__(self, config: SpeculativeConfig, cost_model: CostModel | None = None):
        if not isinstance(config, SpeculativeConfig):
            raise HyspecError(f"GoodputController needs a SpeculativeConfig, got {type(config).__name__}")
        c = config.controller
        self.config = config
        self.cost_model = cost_model if cost_model is not None else CostModel()
        self.enabled = c.enabled
        self.alpha = c.ewma_alpha
        self.min_tokens = c.min_draft_tokens
        self.max_tokens = c.max_draft_tokens
        self.prior = c.acceptance_prior
        self.explore_interval = c.explore_interval
        self.threshold = 1.0 + c.min_gain
        self.tree_budget = config.tree.budget
        self.tree_depth = config.tree.depth
        self.budget_buckets = tuple(sorted({b for b in (2, 4, 8, 16, 32, 64, 128, 256) if b < self.tree_budget}
                                           | {self.tree_budget}))
        # hybrid methods may draft less than the top-level maximum
        self._caps = {m.method: min(m.num_speculative_tokens, self.max_tokens) for m in config.hybrid.methods}
        self._methods: dict[str, _MethodState] = {}
        self._host: dict[tuple[int, bool], float] = {}  # (batch size, speculated) -> EWMA host seconds a step
        self._sizers: dict[str, DraftSizer] = {}  # scored methods: per-node calibration (draft_sizing.py)
        self._drafting: dict[str, DraftingValue] = {}  # scored methods: whether drafting pays (draft_value.py)

    def cap(self, method: str, num_tokens: int) -> None:
        """``method`` drafts at most ``num_tokens`` (and never more than the top-level maximum)."""
        self._caps[method] = min(num_tokens, self.max_tokens, self._caps.get(method, self.max_tokens))

    @classmethod
    def from_profile(cls, config: SpeculativeConfig, measure: Callable[[int, int], float],
                     max_batch_size: int) -> "GoodputController":
        """Profile the target at start-up when ``controller.profile_at_startup`` says so.

        The grid covers batch sizes 1, 2, 4, ... up to ``max_batch_size`` and token
        counts k + 1 for k in 0, 1, 2, 4, ... up to the configured maximum draft.
        """
        if not config.controller.profile_at_startup:
            return cls(config)
        batches = sorted({min(2 ** i, max_batch_size) for i in range(max_batch_size.bit_length() + 1)})
        top = max(config.controller.max_draft_tokens, config.tree.budget)
        tokens = sorted({1, 2, 3} | {min(2 ** i, top) + 1 for i in range(top.bit_length() + 1)})
        return cls(config, CostModel.profile(measure, batches, tokens))

    # -- observations ------------------------------------------------------------------
    def observe_acceptance(self, method: str, accepted_per_position: Sequence[int], num_drafts: int,
                           drafted_per_position: Sequence[int] | None = None) -> None:
        """One verified step of chain drafts.

        ``accepted_per_position[j]``: drafts whose position j was accepted (so
        positions 0..j all were), as vLLM counts them; ``num_drafts``: drafts
        verified.  When drafts were ragged (a proposer drafted fewer tokens for
        some sequences), ``drafted_per_position[j]`` says how many drafts had a
        position j, so a short draft does not read as a rejection.
        """
        st = self._state(method)
        reached = num_drafts
        for j, accepted in enumerate(accepted_per_position[:len(st.accepted)]):
            denom = reached if drafted_per_position is None else min(reached, drafted_per_position[j])
            if accepted < 0 or accepted > denom:
                raise HyspecError(f"observe_acceptance({method!r}): position {j} has {accepted} accepted "
                                  f"of {denom} drafts that reached it")
            if denom > 0:
                st.accepted[j] = (1.0 - self.alpha) * st.accepted[j] + self.alpha * accepted / denom
                st.reached[j] = (1.0 - self.alpha) * st.reached[j] + self.alpha
                st.steps[j] += 1
            reached = accepted

    def observe_tree_acceptance(self, method: str, budget: int, accepted_lengths: Sequence[int]) -> None:
        """One verified step of tree drafts of ``budget`` nodes: accepted path length per sequence."""
        if not accepted_lengths:
            return
        bucket = self._bucket(budget)
        st = self._state(method)
        mean = sum(accepted_lengths) / len(accepted_lengths)
        # Bias-corrected rather than decaying from the prior: with alpha 0.05 and one estimate per bucket
        # (seven buckets up to a budget of 64), a suffix tree on the chat set (31 % first-node acceptance)
        # kept drafting on 636 of 768 steps while every bucket's estimate crept down from the prior.
        st.tree_accepted[bucket] = (1.0 - self.alpha) * st.tree_accepted.get(bucket, 0.0) + self.alpha * mean
        st.tree_weight[bucket] = (1.0 - self.alpha) * st.tree_weight.get(bucket, 0.0) + self.alpha
        st.tree_count[bucket] = st.tree_count.get(bucket, 0) + len(accepted_lengths)

    def observe_step_time(self, batch_size: int, tokens_per_seq: float, seconds: float) -> None:
        """A measured target step (prefill excluded) verifying ``tokens_per_seq`` per sequence on average."""
        self.cost_model.observe(batch_size, tokens_per_seq, seconds)

    def observe_host_time(self, batch_size: int, speculated: bool, seconds: float) -> None:
        """A decode step's wall time outside the target forward and the drafting (``speculated``: it verified
        drafts)."""
        if not seconds >= 0.0:
            return  # clock noise made it negative: nothing to learn
        key = (batch_size, bool(speculated))
        old = self._host.get(key)
        self._host[key] = seconds if old is None else old + self.alpha * (seconds - old)

    def host_seconds(self, batch_size: int, speculated: bool) -> float:
        """Predicted host time of a step (a speculative one not yet observed: a plain one's)."""
        plain = self._host.get((batch_size, False), 0.0)
        return self._host.get((batch_size, True), plain) if speculated else plain

    def observe_draft_time(self, method: str, num_tokens: int, seconds: float) -> None:
        """A measured drafting step: ``num_tokens`` drafted in total over the batch."""
        self._state(method).draft.observe(num_tokens, seconds)

    # -- decisions ---------------------------------------------------------------------
    def choose(self, method: str, batch_size: int) -> int:
        """Draft length for this step of a chain method; 0 = plain decoding."""
        if batch_size < 1:
            raise HyspecError(f"choose: batch_size must be >= 1, got {batch_size}")
        cap = self._caps.get(method, self.max_tokens)
        if not self.enabled:
            return cap
        st = self._state(method)
        candidates = range(max(1, self.min_tokens), cap + 1)
        expected = self._expected_tokens(self._acceptance(st))
        return self._decide(st, batch_size, candidates, lambda k: expected[k], lambda k: k + 1)

    def choose_tree_budget(self, method: str, batch_size: int) -> int:
        """Tree budget (draft nodes per sequence) for this step of a tree method; 0 = plain decoding."""
        if batch_size < 1:
            raise HyspecError(f"choose_tree_budget: batch_size must be >= 1, got {batch_size}")
        if not self.enabled:
            return self.tree_budget
        st = self._state(method)
        candidates = [b for b in self.budget_buckets if b >= self.min_tokens] or [self.tree_budget]
        return self._decide(st, batch_size, candidates,
                            lambda b: 1.0 + self._tree_estimate(st, b),
                            lambda b: min(b, self.tree_depth) + 1)

    def choose_scored_budget(self, method: str, batch_size: int) -> int:
        """Budget for a scored method (drafts sized after drafting, :meth:`size_scored`): the full tree budget
        whenever drafts accepted whole could beat plain decoding at this batch size, else 0."""
        if batch_size < 1:
            raise HyspecError(f"choose_scored_budget: batch_size must be >= 1, got {batch_size}")
        if not self.enabled:
            return self.tree_budget
        seconds, plain = self._costs(self._state(method), batch_size, self.budget_buckets)
        if any((min(b, self.tree_depth) + 1) / seconds[b] > plain for b in self.budget_buckets):
            return self.tree_budget
        return 0

    def size_scored(self, method: str, batch_size: int, trees: dict[str, DraftTree]) -> dict[str, DraftTree]:
        """The scored drafts worth verifying this step, each cut to its kept nodes (draft_sizing.py)."""
        if not self.enabled or not trees:
            return trees
        predict = self.cost_model.predict
        host = self.host_seconds(batch_size, True)
        plain_step = predict(batch_size, 1) + self.host_seconds(batch_size, False)
        sizer = self._sizer(method)
        spec_seconds = lambda n: predict(batch_size, 1 + n / batch_size) + host  # noqa: E731
        kept = sizer.size(trees, batch_size, spec_seconds, self.threshold * batch_size / plain_step)
        if sizer.last_choice:  # what the choice saves: its expected tokens at plain seconds per token, less its step
            nodes, expected = sizer.last_choice
            self.drafting_value(method).expect(expected * plain_step / batch_size - spec_seconds(nodes))
        return kept

    def drafting_value(self, method: str) -> DraftingValue:
        """Whether drafting pays for the scored ``method`` (draft_value.py)."""
        tracker = self._drafting.get(method)
        if tracker is None:
            tracker = self._drafting[method] = DraftingValue()
        return tracker

    def should_draft(self, method: str) -> bool:
        """Whether the scored ``method`` drafts this step: always while the controller is off."""
        return not self.enabled or self.drafting_value(method).should_draft()

    def observe_scored(self, method: str, tree: DraftTree, accepted_path: Sequence[int]) -> None:
        """A verified scored draft: which of its nodes were accepted (the path, root excluded)."""
        self._sizer(method).observe(tree, list(accepted_path))

    def _sizer(self, method: str) -> DraftSizer:
        sizer = self._sizers.get(method)
        if sizer is None:
            sizer = self._sizers[method] = DraftSizer(self.prior, self.explore_interval)
        return sizer

    def goodput(self, method: str, batch_size: int, k: int) -> float:
        """Predicted committed tokens per second per sequence for a chain of k (k = 0: plain)."""
        st = self._state(method)
        if k == 0:
            return 1.0 / (self.cost_model.predict(batch_size, 1) + self.host_seconds(batch_size, False))
        return self._expected_tokens(self._acceptance(st))[k] / self._step_seconds(st, batch_size, k)

    def acceptance(self, method: str) -> tuple[float, ...]:
        """Current per-position conditional acceptance estimates of a method."""
        return tuple(self._acceptance(self._state(method)))

    def first_acceptance(self, method: str) -> float:
        """The estimate for a method's first draft position (the dispatcher's ``accept_rate`` signal, read
        every step: one position, not the whole chain)."""
        first = self._acceptance(self._state(method), 1)
        return first[0] if first else self.prior

    # -- internals ---------------------------------------------------------------------
    def _acceptance(self, st: _MethodState, positions: int | None = None) -> list[float]:
        """Per-position estimates: the discounted rate with the prior as PRIOR_STEPS steps of weight
        (bias-corrected); the prior of a position is the configured one until the position before it has
        been verified, then that position's estimate."""
        out: list[float] = []
        prior, seen = self.prior, False
        for accepted, reached, steps in zip(st.accepted[:positions], st.reached, st.steps):
            if seen:
                prior = out[-1]
            weight = PRIOR_STEPS * self.alpha * (1.0 - self.alpha) ** steps  # discounted like the steps
            out.append((accepted + weight * prior) / (reached + weight))
            seen = steps > 0
        return out

    def _decide(self, st: _MethodState, batch: int, candidates: Sequence[int],
                expected: Callable[[int], float], perfect: Callable[[int], float]) -> int:
        seconds, plain = self._costs(st, batch, candidates)
        best = _best_size(candidates, expected, seconds, plain)
        if best:
            st.plain_streak = 0
            return best
        st.plain_streak += 1
        if self.explore_interval and st.plain_streak >= self.explore_interval:
            # probe at the size perfect acceptance would pick, if perfect acceptance could pay at all
            probe = _best_size(candidates, perfect, seconds, plain)
            if probe:
                st.plain_streak = 0
                logger.debug("goodput controller: probing %d draft tokens after %d plain steps",
                             probe, self.explore_interval)
                return probe
        return 0

    def _costs(self, st: _MethodState, batch: int, candidates: Sequence[int]) -> tuple[dict[int, float], float]:
        """Predicted seconds of a step drafting and verifying n nodes per sequence, for each candidate n, and
        the per-sequence goodput a speculative step must beat (plain decoding's, times 1 + min_gain)."""
        predict = self.cost_model.predict
        overhead, per_token = st.draft.coefficients()
        host = self.host_seconds(batch, True)
        seconds = {n: overhead + per_token * batch * n + predict(batch, n + 1) + host for n in candidates}
        return seconds, self.threshold / (predict(batch, 1) + self.host_seconds(batch, False))

    def _step_seconds(self, st: _MethodState, batch: int, n: int) -> float:
        return st.draft.predict(batch * n) + self.cost_model.predict(batch, n + 1) + self.host_seconds(batch, True)

    @staticmethod
    def _expected_tokens(acceptance: Sequence[float]) -> list[float]:
        """E[tokens | k] for k = 0..len(acceptance)."""
        out, survive = [1.0], 1.0
        for a in acceptance:
            survive *= a
            out.append(out[-1] + survive)
        return out

    def _tree_estimate(self, st: _MethodState, bucket: int) -> float:
        """Expected accepted length of a tree of this budget bucket: measured; while unmeasured, the optimistic
        prior scaled by how the measured buckets did against theirs (measured / prior, weighed by the trees
        verified, the prior one tree's worth).  With the prior alone every bucket (seven up to a budget of 32)
        drafted at least once on chat, where trees lose at a few plain steps' cost each; the prior's one tree
        keeps a single unlucky tree from writing the other buckets off."""
        weight = st.tree_weight.get(bucket, 0.0)
        if weight > 0.0:
            return st.tree_accepted[bucket] / weight
        trees = ratio = 0.0
        for b, n in st.tree_count.items():
            trees += n
            ratio += n * (st.tree_accepted[b] / st.tree_weight[b]) / self._tree_prior(b)
        return self._tree_prior(bucket) * (ratio + 1.0) / (trees + 1.0)

    def _tree_prior(self, budget: int) -> float:
        """Optimistic expected accepted length of a tree: per level, any of its width nodes may match."""
        depth = min(self.tree_depth, budget)
        width = max(1, budget // depth)
        level = 1.0 - (1.0 - self.prior) ** width
        return sum(level ** i for i in range(1, depth + 1))

    def _bucket(self, budget: int) -> int:
        fits = [b for b in self.budget_buckets if b <= budget]
        return fits[-1] if fits else self.budget_buckets[0]

    def _state(self, method: str) -> _MethodState:
        st = self._methods.get(method)
        if st is None:
            n = self.max_tokens
            st = _MethodState([0.0] * n, [0.0] * n, [0] * n, DraftCost(self.alpha))
            self._methods[method] = st
        return st


def _best_size(candidates: Sequence[int], tokens: Callable[[int], float], seconds: Mapping[int, float],
               plain: float) -> int:
    """The candidate size whose goodput (``tokens(n) / seconds[n]``) beats ``plain`` most; 0 when none does."""
    best, best_goodput = 0, plain
    for n in candidates:
        goodput = tokens(n) / seconds[n]
        if goodput > best_goodput:
            best, best_goodput = n, goodput
    return best
