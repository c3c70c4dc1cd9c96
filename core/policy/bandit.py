"""``hybrid.policy: "bandit"``: which method (plain included) pays, learnt from measured goodput.

The engine verifies one method per step, so the choice is per step; what is learnt is per *class*
of step -- the batch's mean context length, its size and, when a model-free drafter is loaded, the
longest copy it finds right now (``StepSignals.match_length``), each in a few buckets -- because
which drafter pays depends on all three (prompt lookup pays on long prompts it can copy from; at
large batches the verification forward stops being free and plain decoding wins; and a step that
can copy 16 tokens from an earlier response is a different bet from one that can copy nothing).
Without the match bucket the classes mix an agent's re-run, where suffix decoding commits tens of
tokens a step, with a fresh question, where nothing drafts well: the means then follow whichever
kind of request came last, and the policy switches to the wrong arm as a copy begins.

Per class and arm the policy keeps the arm's goodput: the tokens its steps committed over those
steps' wall time (drafting, the target forward and verification), both summed with a discount, so
a drafter that is accepted often but costs too much loses to one that is accepted less and costs
nothing.  It is a ratio of sums (the arm's tokens per second), not a mean of per-step ratios: a
drafter's steps commit one token or ten, and a short mean of such ratios swings past a steady
arm's often enough to send the policy there for long stretches (it comes back only by
exploration).  Choice:

1. every arm is chosen ``warmup`` times in a class before anything else (least-chosen first);
2. then the arm with the highest mean, except that one step in ``1 / explore_fraction`` (counted
   per class, deterministic) tries the arm chosen longest ago, provided the class's exploring steps
   so far took at most ``explore_fraction`` of its measured time -- so exploration is bounded by
   ``explore_fraction`` of the steps *and* of the time (at batch 32 a speculative step verifies 32 x
   (k + 1) rows and can cost several plain steps: bounded by steps alone, a tenth of the steps was
   a third of the time), and a method that got better (a warmer cache, a longer prompt) is found
   again.  Back-off: an arm whose exploring step (its own tokens per second) fell below
   ``BACKOFF_GAP`` of the best arm's estimate, and whose estimate plus ``OPTIMISM`` standard errors
   (from the spread of its steps' token counts; at least 1/pulls of the estimate while few are in)
   is behind too, waits twice as long before its next one, up to ``max_backoff`` base intervals
   (``hybrid.bandit_max_backoff``); one whose step came within the gap is back at the base
   interval.  The error bound matters for an arm whose steps commit one token or eight (suffix
   decoding on fresh code): most of its single steps trail a steady arm while its mean leads, and
   judged on steps alone it was backed off for good (simulated, ``tests/test_dispatch_bandit.py``:
   a 228 tok/s arm against 143 tok/s plain decoding got 46 % of the steps).
   Why: with nine arms, seven of which never paid (the default model's drafters on a 2-core CPU),
   one step in ten went to a loser committing about one token where suffix decoding committed 3.5,
   about 7 % of the tokens by that arithmetic, and the hybrid trailed suffix alone by 8.5 % on
   HumanEval (171.9 vs 187.8 tok/s; docs/results/2026-12-05/drafters/ at commit ff8cba3).  Backed off,
   each loser is tried once in ``max_backoff`` intervals, and a method that starts to pay is still
   found: its next exploring step resets it;
3. the discount (``discount`` per observation of that arm; 0.99 remembers about a hundred steps)
   lets old measurements fade;
4. at batch sizes above 1, a method is exploited only while its estimate beats plain decoding's by
   ``plain_margin``: arms whose goodputs lie within a few per cent are a tie the noise decides, and on
   a tie plain decoding is the arm that loses nothing when the estimate was wrong.  At large batches
   the speculative arms and plain often sit that close (a speculative step there verifies batch x
   (k + 1) rows on compute that is already busy), and those classes are visited less, so their
   estimates are noisier.  At batch 1 verification is nearly free, the gains are often a few per
   cent, and a margin there only gave them away (measured on the mixed workload: see
   docs/results/2026-12-04/mixed-continuous-margin/).

Classes are many (context x batch x match buckets) and some are rare, so each borrows from its
*parent*, the same class without the context bucket (``ctx<=1024,bs<=1,match<=3`` -> ``bs<=1,
match<=3``), which sees every step of its children: an arm's estimate is its class's tokens and
seconds plus ``PRIOR_STEPS`` steps' worth at the parent's goodput, and an arm the parent has tried
``warmup`` times needs no warm-up in a new child.  A rare class then starts from what the common
ones learnt instead of from two warm-up steps that may have been unlucky, and a well-visited
class is ruled by its own measurements.

Only decode steps teach it (a step that also prefills says nothing about the method's speed).
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

from hyspec.errors import ConfigError
from hyspec.policy.signals import NONE

#: steps' worth of the parent class's goodput in each arm's estimate (see the module docstring)
PRIOR_STEPS = 4.0
#: an explored arm whose estimate stays below this share of the best's backs off (see the module docstring)
BACKOFF_GAP = 0.9
#: standard errors of an arm's goodput added when judging how good it may still be (exploration order, back-off)
OPTIMISM = 2.0
#: the longest an arm waits between explorations, in base exploration intervals (1 / explore_fraction steps):
#: hybrid.bandit_max_backoff's default
MAX_BACKOFF = 64

#: mean context length buckets (upper bounds, tokens), batch size buckets and match length buckets
#: (nothing to copy; a few tokens, which drafts a few at best; a real copy; a long one)
CONTEXT_BUCKETS = (256, 1024, 4096)
BATCH_BUCKETS = (1, 4, 16)
MATCH_BUCKETS = (0, 3, 15)


def step_class(context_length: float, batch_size: int, match_length: int | None = None) -> str:
    """A label like ``ctx<=1024,bs<=4`` or ``ctx<=256,bs<=1,match>15`` (the last bucket of each is ``>``);
    the match part only when a match length was measured."""
    def bucket(value: float, bounds: tuple[int, ...], name: str) -> str:
        for b in bounds:
            if value <= b:
                return f"{name}<={b}"
        return f"{name}>{bounds[-1]}"

    label = f"{bucket(context_length, CONTEXT_BUCKETS, 'ctx')},{bucket(batch_size, BATCH_BUCKETS, 'bs')}"
    if match_length is None:
        return label
    return f"{label},{bucket(match_length, MATCH_BUCKETS, 'match')}"


def parent_class(klass: str) -> str | None:
    """The class without its context bucket (None for a class of one part): what a rare class borrows from."""
    head, sep, rest = klass.partition(",")
    return rest if sep and head.startswith("ctx") else None


@dataclass
class ArmStats:
    weight: float = 0.0  # discounted count
    tokens: float = 0.0  # discounted committed tokens
    sq_tokens: float = 0.0  # discounted sum of each step's tokens squared (the spread of an arm's steps)
    seconds: float = 0.0  # discounted wall time of those steps
    mean: float = 0.0  # tokens / seconds: the arm's goodput, tokens/s
    pulls: int = 0  # undiscounted: times observed
    chosen: int = 0  # times chosen (a chosen step that also prefilled is not observed)
    last_step: int = -1  # the class step at which it was last chosen
    backoff: int = 1  # exploration interval of this arm, in base intervals (1 .. MAX_BACKOFF)
    vetoed: bool = False  # its last choice here was made a plain step (vetoed): not exploited until it drafts


@dataclass
class ClassState:
    arms: dict[str, ArmStats] = field(default_factory=dict)
    steps: int = 0
    explorations: int = 0
    seconds: float = 0.0  # measured time of the class's steps (undiscounted)
    explore_seconds: float = 0.0  # of which, exploring steps


@dataclass(frozen=True)
class BanditSnapshot:
    choices: dict[tuple[str, str], int]  # (class, arm) -> steps it was chosen
    goodput: dict[tuple[str, str], float]  # (class, arm) -> discounted tokens / discounted seconds
    explorations: int


class BanditPolicy:
    def __init__(self, arms: list[str] | tuple[str, ...], explore_fraction: float = 0.1, warmup: int = 2,
                 discount: float = 0.99, *, plain_margin: float = 0.0, max_backoff: int = MAX_BACKOFF):
        arms = tuple(dict.fromkeys(arms))
        if not arms:
            raise ConfigError("speculative_config.hybrid.policy", "the bandit needs at least one method to choose "
                                                                  "from, and none is loaded")
        if not 0.0 < explore_fraction <= 0.5:
            raise ConfigError("speculative_config.hybrid.bandit_explore_fraction",
                              f"must be in (0, 0.5], got {explore_fraction}")
        if warmup < 1:
            raise ConfigError("speculative_config.hybrid.bandit_warmup", f"must be >= 1, got {warmup}")
        if not 0.0 < discount <= 1.0:
            raise ConfigError("speculative_config.hybrid.bandit_discount", f"must be in (0, 1], got {discount}")
        if isinstance(max_backoff, bool) or not isinstance(max_backoff, int) or not 1 <= max_backoff <= 4096:
            raise ConfigError("speculative_config.hybrid.bandit_max_backoff",
                              f"must be an integer in [1, 4096], got {max_backoff!r}")
        if not 0.0 <= plain_margin <= 0.5:
            raise ConfigError("speculative_config.hybrid.bandit_plain_margin",
                              f"must be in [0, 0.5], got {plain_margin}")
        self.arms = arms
        self.explore_fraction = explore_fraction
        self.explore_every = max(2, round(1.0 / explore_fraction))
        self.warmup = warmup
        self.discount = discount
        self.plain = NONE if NONE in arms else None  # the arm that drafts nothing, preferred on a near-tie
        self.plain_margin = plain_margin
        self.max_backoff = max_backoff
        self._classes: dict[str, ClassState] = {}
        self._parents: dict[str, ClassState] = {}  # the classes without their context bucket (parent_class)
        self._choices: dict[tuple[str, str], int] = {}
        self._exploring: dict[str, str] = {}  # class -> the arm its last choice explored (until observed)
        self._lock = threading.Lock()  # choose/observe on the engine thread, snapshot at scrape time

    def choose(self, klass: str, batch_size: int | None = None) -> str:
        """The arm for the next step of class ``klass``; ``batch_size`` (the step's) gates ``plain_margin``."""
        with self._lock:
            state = self._state(klass)
            parent = self._parent(klass)
            state.steps += 1
            self._exploring.pop(klass, None)  # a step that taught nothing (a prefill) ends that exploration
            cold = [a for a in self.arms if state.arms[a].chosen < self.warmup
                    and (parent is None or parent.arms[a].pulls < self.warmup)]
            if cold:
                arm = min(cold, key=lambda a: state.arms[a].chosen)
            elif (state.steps % self.explore_every == 0 and len(self.arms) > 1
                  and state.explore_seconds <= self.explore_fraction * state.seconds):
                best = self._best(state, parent, batch_size)
                due = [a for a in self.arms if a != best
                       and state.steps - state.arms[a].last_step >= self.explore_every * state.arms[a].backoff]
                if due:
                    arm = min(due, key=lambda a: state.arms[a].last_step)
                    state.explorations += 1
                    self._exploring[klass] = arm
                else:  # every other arm lost its last try and is backing off
                    arm = best
            else:
                arm = self._best(state, parent, batch_size)
            state.arms[arm].chosen += 1
            state.arms[arm].last_step = state.steps
            self._choices[(klass, arm)] = self._choices.get((klass, arm), 0) + 1
            return arm

    def observe(self, klass: str, arm: str, tokens: int, seconds: float) -> None:
        """A step of class ``klass`` decoded with ``arm`` committed ``tokens`` in ``seconds``."""
        if arm not in self.arms or seconds <= 0 or tokens < 0:
            return
        with self._lock:
            own = self._state(klass)
            own.seconds += seconds
            explored = self._exploring.pop(klass, None) == arm
            if explored:
                own.explore_seconds += seconds
            parent = self._parent(klass)
            own.arms[arm].vetoed = False  # it drafted: judged on its steps again
            for state in (own, parent):
                if state is None:
                    continue
                stats = state.arms[arm]
                stats.weight = self.discount * stats.weight + 1.0
                stats.tokens = self.discount * stats.tokens + tokens
                stats.sq_tokens = self.discount * stats.sq_tokens + tokens * tokens
                stats.seconds = self.discount * stats.seconds + seconds
                stats.mean = stats.tokens / stats.seconds
                stats.pulls += 1
            if explored:
                # Reset on this step alone (an arm that improved must not wait for its old mean); back off only
                # when its estimate, this step included, is behind too: an arm whose steps commit one token or
                # eight (suffix decoding on fresh code) has most single steps behind a steady arm while its
                # mean is ahead, and judged on steps alone it was backed off for good (simulated: a 228 tok/s
                # arm against 143 tok/s plain got 46 % of the steps and 182 tok/s)
                rival = max(self._estimate(own, parent, a) for a in self.arms if a != arm)
                stats = own.arms[arm]
                if tokens / seconds >= BACKOFF_GAP * rival:
                    stats.backoff = 1
                elif self._optimistic(own, parent, arm) < BACKOFF_GAP * rival:
                    stats.backoff = min(2 * stats.backoff, self.max_backoff)

    def vetoed(self, klass: str, arm: str) -> None:
        """The step just chosen for ``arm`` in ``klass`` did not draft: a later gate (the goodput controller's zero
        budget, a released drafter, the batch-size limit) made it a plain step, which the caller observes as the
        plain arm's.  Credited to ``arm``, such steps made it a copy of plain decoding, and among several such
        copies the luckiest estimate beat plain's and was exploited, every step paying for a plan that drafted
        nothing.  So ``arm`` is not exploited in this class until a step of its own is observed, and a vetoed
        exploration backs off as a lost one does: explored ever less often, found again once it drafts and
        pays."""
        with self._lock:
            state = self._classes.get(klass)
            if state is None or arm not in state.arms:
                return
            stats = state.arms[arm]
            stats.vetoed = True
            if self._exploring.get(klass) == arm:
                del self._exploring[klass]
                stats.backoff = min(2 * stats.backoff, self.max_backoff)

    def snapshot(self) -> BanditSnapshot:
        with self._lock:
            goodput = {(k, a): s.mean for k, st in self._classes.items() for a, s in st.arms.items() if s.pulls}
            return BanditSnapshot(dict(self._choices), goodput,
                                  sum(st.explorations for st in self._classes.values()))

    def _state(self, klass: str) -> ClassState:
        state = self._classes.get(klass)
        if state is None:
            state = self._classes[klass] = ClassState({a: ArmStats() for a in self.arms})
        return state

    def _parent(self, klass: str) -> ClassState | None:
        name = parent_class(klass)
        if name is None:
            return None
        state = self._parents.get(name)
        if state is None:
            state = self._parents[name] = ClassState({a: ArmStats() for a in self.arms})
        return state

    @staticmethod
    def _estimate(state: ClassState, parent: ClassState | None, arm: str) -> float:
        own = state.arms[arm]
        prior = parent.arms[arm] if parent is not None else None
        if prior is None or not prior.pulls:
            return own.mean
        step = prior.seconds / prior.weight  # the parent's mean step time for this arm
        return (own.tokens + PRIOR_STEPS * prior.mean * step) / (own.seconds + PRIOR_STEPS * step)

    @classmethod
    def _optimistic(cls, state: ClassState, parent: ClassState | None, arm: str) -> float:
        """The arm's estimate plus ``OPTIMISM`` standard errors of it: how good it may still be.  An arm whose
        steps commit one token or eight has a wide error until many steps are in, and must not be written off
        on a few unlucky ones; a steady loser's bound sits on its mean."""
        stats = state.arms[arm]
        estimate = cls._estimate(state, parent, arm)
        if stats.pulls < 2:  # no spread measured yet
            return float("inf")
        mean_tokens = stats.tokens / stats.weight
        variance = max(stats.sq_tokens / stats.weight - mean_tokens * mean_tokens, 0.0)
        step_seconds = stats.seconds / stats.weight
        # a few identical steps measure no spread; until more are in, allow 1/pulls of the estimate
        error = max(math.sqrt(variance / stats.weight) / step_seconds, estimate / stats.pulls)
        return estimate + OPTIMISM * error

    def _best(self, state: ClassState, parent: ClassState | None, batch_size: int | None = None) -> str:
        def estimate(arm: str) -> float:
            return self._estimate(state, parent, arm)

        arms = [a for a in self.arms if not state.arms[a].vetoed] or self.arms
        best = max(arms, key=lambda a: (estimate(a), -self.arms.index(a)))
        margin = self.plain_margin if batch_size is None or batch_size > 1 else 0.0
        if self.plain is not None and best != self.plain and margin > 0.0:
            if estimate(best) < (1.0 + margin) * estimate(self.plain):
                return self.plain  # a lead inside the margin is noise: decode plainly
        return best


__all__ = ["BanditPolicy", "BanditSnapshot", "parent_class", "step_class"]
