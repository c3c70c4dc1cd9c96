"""The hybrid inside vLLM: per step, which draft tokens are worth verifying for the batch at hand, from a cost
model of vLLM's step and each drafting arm's measured acceptance; none when no draft pays (the auto-off).

What vLLM's hook lets us see: each ``propose`` call hands the tokens the previous step committed per row
(``sampled_token_ids``: accepted drafts + 1), and the time from the end of one call to the start of the next is
vLLM's step (scheduling, the forward over every row's token and drafts, verification, sampling; vLLM turns
async scheduling off for a ``custom_class`` proposer, so the steps do not overlap).  From these, two things are
learnt, from every step whatever it drafted:

* **the step's cost**: :class:`hyspec.policy.cost_model.CostModel` (hyspec's engine's own), fitted online on
  (tokens the step scored: rows + drafts, seconds).  On vLLM's CPU build a decode step is roughly a fixed
  ~60 ms plus ~4-5 ms per token scored (docs/results/2026-12-06/vllm-bench/, vLLM plain with its TTFT taken
  out: ~65 / 90 / 200 ms a step at batch 1 / 8 / 32), so at batch 1 a drafted token costs a fifteenth of the
  step and nearly any draft pays, while at batch 32 a row's share of the fixed part is ~2 ms and only a token
  accepted with P > ~0.7 pays for itself.  One model over all
  batch sizes, in the tokens scored alone (a row is one token more): what batch 1 taught predicts batch 8
  from its first step.  (Fed as batch 1 of m tokens: with a separate per-row term, steps of one batch size
  cannot tell it from the fixed cost, and the fit then split the two and mispredicted every other size.)
* **each draft token's chance of acceptance**: :class:`hyspec.policy.draft_sizing.DraftSizer`'s calibration,
  per cell of (source, match length, the drafter's own estimate), shared across batch sizes.  Suffix drafts
  carry their own estimate (each token's share of the matched occurrences; sources: the request's own tokens,
  earlier responses, the corpus); ngram and remote drafts are point proposals, one cell per method and match
  length, so their acceptance decays geometrically along a chain.

The choice (as draft sizing in hyspec's engine, over chains): every arm drafts every row at the full budget
(model-free arms are cheap; a remote worker drafts off this machine), each row keeps the arm whose chain has
the larger expected accepted length, and over the batch the draft tokens ranked by P (the chance their whole
prefix is accepted) are kept while they raise the predicted goodput ``(rows + sum P) / T(rows + n)`` above
plain decoding's ``rows / T(rows)`` by ``min_gain``.  A row's kept tokens are always a prefix of its
chain.  Lossless whatever is kept: vLLM verifies.  After ``explore_interval`` steps in a row that kept nothing
while drafts were there, one step verifies the likeliest row's chain whole (one row: at batch 32 a whole
batch of drafts costs several plain steps), so a cell's stale estimate cannot keep drafting off for good.  The
cost needs steps of different token counts: while the model has seen one count only, a step after one that
drafted drafts nothing.

A step that admitted a request (a prefill) or where a row prefilled says nothing about decode cost: not learnt.
Load fallback: while the batch holds more than ``load_threshold`` of vLLM's ``max_num_seqs``, no drafts.

**Waves.**  The goodput rule values an accepted token as a step saved for its row, which is right when a
finished request's place is taken at once (a full batch with requests waiting).  A batch whose requests were
admitted together and that nothing joins (``LLM.generate`` over a list; a burst of clients) lasts as long as
its slowest row: a row that finishes early only makes the later steps one token cheaper, which is what each of
its draft tokens cost to verify, so its drafts cannot pay.  Measured inside vLLM (HumanEval, a wave of 32
requests of 48 tokens, docs/results/2026-12-06/vllm-hybrid/): the goodput rule sent 2258 draft tokens and 82 %
were accepted, yet every pass still took 49 steps, its slowest rows having found nothing to draft.  So in such
a wave (``wave_makespan``, on by default; below ``max_num_seqs``, where nothing can be waiting for a row) only
rows within a chain's length of the most tokens left (``max_tokens``), and with more left than any row that has
nothing to draft this step, are offered to the goodput rule (hyspec.policy.wave, shared with hyspec's engine).

Why not the bandit of hyspec's engine, which this module used before: it learnt a goodput per class of step
(context x batch x match buckets) from the steps each arm was chosen in.  A bench pass gives a batch size a few
dozen steps, split over its classes and three arms with a warm-up of two steps each and a tenth explored, so
the batch-8 and batch-32 classes were still learning when the pass ended, and nothing learnt at batch 1 carried
over: vLLM + hyspec ran at 0.89x / 0.92x vLLM plain at batch 8 / 32 (docs/results/2026-12-06/vllm-bench/).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hyspec.policy.cost_model import CostModel
from hyspec.policy.draft_sizing import Cell, DraftSizer, cell_of
from hyspec.policy.wave import critical_rows

#: NodeScores-style sources of the arms that give no estimate of their own (suffix's are 0, 1, 2: own tokens,
#: cached responses, corpus; hyspec.drafters.suffix.proposer)
NGRAM_SOURCE, REMOTE_SOURCE = 10, 11
#: the decision counters' batch-size classes (upper bounds; the last class is "> 32")
BATCH_CLASSES = (1, 4, 8, 16, 32)
#: the cost model is refitted this often (steps): a bench pass gives each batch size a few dozen steps, and the
#: engine's default (256, for a model profiled at start-up) would leave its first fit in place for all of them
REFIT_EVERY = 8
#: the learnt steps kept for inspection (rows, draft tokens, seconds): what the cost fit sees, for the A/B script
#: (scripts/vllm_ab.py) to check whether a step that verifies drafts costs more than its tokens say
STEP_LOG = 512


def batch_class(rows: int) -> str:
    """``"1"``, ``"2-4"``, ``"5-8"``, ``"9-16"``, ``"17-32"`` or ``"33+"``."""
    low = 1
    for high in BATCH_CLASSES:
        if rows <= high:
            return str(high) if low == high else f"{low}-{high}"
        low = high + 1
    return f"{low}+"


ALL_BATCH_CLASSES = tuple(batch_class(n) for n in (*BATCH_CLASSES, BATCH_CLASSES[-1] + 1))


@dataclass(frozen=True)
class Candidate:
    """One arm's draft chain for one request, with what its acceptance is judged by."""

    method: str  # the arm: suffix, ngram or remote
    tokens: tuple[int, ...]
    conditional: tuple[float, ...]  # each token's own estimate (suffix: its share of the occurrences; else 1.0)
    source: int  # suffix: 0 own tokens, 1 cached responses, 2 corpus; NGRAM_SOURCE; REMOTE_SOURCE
    match_length: int  # the matched suffix (suffix), n-gram (ngram), 0 (remote)

    def cells(self) -> list[Cell]:
        return [cell_of(self.source, self.match_length, c) for c in self.conditional]

    def cut(self, n: int) -> Candidate:
        return Candidate(self.method, self.tokens[:n], self.conditional[:n], self.source, self.match_length)


@dataclass(frozen=True)
class _Pending:
    request_ids: frozenset[str]  # the decoding rows the step was planned for
    ended: float  # when propose returned: vLLM's step runs from here to the next call
    sent: Mapping[str, Candidate]  # request id -> the chain sent for verification


class VllmHybrid:
    """Learns vLLM's step cost and each arm's acceptance; plans each step's drafts (see the module docstring)."""

    def __init__(self, max_num_seqs: int, load_threshold: float, explore_interval: int, min_gain: float,
                 prior: float = 0.9):
        """``prior``: a never-verified cell's acceptance (optimistic, so a new arm or source gets tried)."""
        self.cost = CostModel(refit_every=REFIT_EVERY, window=256)
        self.calibration = DraftSizer(prior, explore_interval)
        self.max_num_seqs = max(1, max_num_seqs)
        self.load_threshold = load_threshold
        self.explore_interval = explore_interval
        self.threshold = 1.0 + min_gain
        self._pending: _Pending | None = None
        self.empty_streak = 0  # consecutive steps that kept nothing while drafts were there
        self.load_fallback_steps = 0
        self.probes = 0
        self.cost_probes = 0  # plain steps taken to measure the cost (see plan)
        self._last_sent = False
        self.cut_tokens = 0  # drafted tokens the plan did not send
        self.wave_steps = 0  # steps planned as a wave's (only rows on its critical path may draft)
        self.wave_cut_tokens = 0  # drafted tokens not sent because their row was off the wave's critical path
        self.decisions = {(c, drafted): 0 for c in ALL_BATCH_CLASSES for drafted in (True, False)}
        self.step_log: deque[tuple[int, int, float]] = deque(maxlen=STEP_LOG)  # (rows, draft tokens, seconds)

    # -- learning ------------------------------------------------------------------------------------------
    def observe(self, request_ids: Sequence[str], sampled: Sequence[int], now: float) -> None:
        """The step planned at the previous call ended: ``sampled[i]`` tokens committed for ``request_ids[i]``
        (0: still prefilling).  Every verified chain teaches its cells; the step's time is learnt only when every
        row decoded and no request joined."""
        pending, self._pending = self._pending, None
        if pending is None or not request_ids:
            return
        for rid, n in zip(request_ids, sampled):
            chain = pending.sent.get(rid)
            if chain is None or n < 1:
                continue
            accepted = min(n - 1, len(chain.tokens))
            for i, cell in enumerate(chain.cells()[:accepted + 1]):  # the first rejected token ends what is known
                self.calibration.observe_node(cell, i < accepted)
        if any(n < 1 for n in sampled) or not set(request_ids) <= pending.request_ids:
            return
        rows = len(request_ids)
        drafted = sum(len(pending.sent[r].tokens) for r in request_ids if r in pending.sent)
        seconds = now - pending.ended
        if seconds > 0:
            self.cost.observe(1, rows + drafted, seconds)
            self.step_log.append((rows, drafted, seconds))

    # -- planning ------------------------------------------------------------------------------------------
    def over_load(self, rows: int) -> bool:
        """The load fallback: no drafts for a batch above ``load_threshold`` of ``max_num_seqs`` (counted)."""
        if rows <= self.load_threshold * self.max_num_seqs:
            return False
        self.load_fallback_steps += 1
        self.decisions[(batch_class(rows), False)] += 1
        return True

    def path_acceptance(self, chain: Candidate) -> list[float]:
        """P of each token of ``chain``: the chance it and every token before it are accepted."""
        out, p = [], 1.0
        for cell in chain.cells():
            p *= self.calibration.acceptance(cell)
            out.append(p)
        return out

    def plan(self, candidates: Mapping[str, Sequence[Candidate]], rows: int,
             remaining: Mapping[str, int] | None = None) -> dict[str, Candidate]:
        """The chains to send, cut to what pays (request id -> chain; a request left out gets no draft).
        ``candidates``: each drafting request's chains, one per arm that found one; ``rows``: the decoding rows
        of the batch (requests without candidates included: they are part of the step's cost); ``remaining``:
        in a wave (see the module docstring), every decoding row's tokens left before its ``max_tokens``."""
        rows = max(1, rows)
        if remaining:
            candidates = self._off_critical_path_cut(candidates, remaining)
        if not self.cost.fitted and self._last_sent:
            # Steps of one token count cannot fit a cost (every step drafting whole chains at batch 1 is one):
            # until two counts are in the model's window, a step after one that drafted drafts nothing.
            self._last_sent = False
            self.cost_probes += 1
            self.decisions[(batch_class(rows), False)] += 1
            return {}
        best: dict[str, tuple[Candidate, list[float]]] = {}
        for rid, chains in candidates.items():
            scored = [(c, self.path_acceptance(c)) for c in chains if c.tokens]
            if scored:
                best[rid] = max(scored, key=lambda cp: sum(cp[1]))  # ties: the first arm listed
        order = list(best)
        ranked = sorted((-p, r, i) for r, rid in enumerate(order) for i, p in enumerate(best[rid][1]))
        predict = self.cost.predict
        keep_n, keep_goodput, expected = 0, self.threshold * rows / predict(1, rows), float(rows)
        for n, (neg_p, _, _) in enumerate(ranked, 1):
            expected -= neg_p
            goodput = expected / predict(1, rows + n)
            if goodput > keep_goodput:
                keep_n, keep_goodput = n, goodput
        kept: dict[str, int] = {}
        for _, r, _ in ranked[:keep_n]:  # within a row P never grows along the chain: a prefix is kept
            kept[order[r]] = kept.get(order[r], 0) + 1
        if not kept and ranked:
            self.empty_streak += 1
            if self.explore_interval and self.empty_streak >= self.explore_interval:
                probe = max(order, key=lambda rid: sum(best[rid][1]))
                kept = {probe: len(best[probe][0].tokens)}
                self.probes += 1
        if kept:
            self.empty_streak = 0
        self.cut_tokens += len(ranked) - sum(kept.values())
        self.decisions[(batch_class(rows), bool(kept))] += 1
        self._last_sent = bool(kept)
        return {rid: best[rid][0].cut(n) for rid, n in kept.items()}

    def _off_critical_path_cut(self, candidates: Mapping[str, Sequence[Candidate]],
                               remaining: Mapping[str, int]) -> dict[str, Sequence[Candidate]]:
        """``candidates`` less the rows whose drafts cannot shorten the wave (hyspec.policy.wave)."""
        lengths = {rid: max((len(c.tokens) for c in chains), default=0) for rid, chains in candidates.items()}
        keep = critical_rows(remaining, lengths)
        self.wave_cut_tokens += sum(n for rid, n in lengths.items() if rid not in keep)
        self.wave_steps += 1
        return {rid: chains for rid, chains in candidates.items() if rid in keep}

    def sent(self, request_ids: Sequence[str], chains: Mapping[str, Candidate], now: float) -> None:
        """What the step planned for ``request_ids`` sends (after any load fallback); ``now``: propose's end."""
        self._pending = _Pending(frozenset(request_ids), now, dict(chains))

    def cost_terms(self) -> dict[str, float]:
        """The step-cost fit, seconds: ``fixed``, ``per_token`` (scored), ``per_token_past_knee`` (and the knee,
        in tokens); empty until steps of two token counts were seen."""
        c = self.cost.coefficients()
        if not c:
            return {}
        ratio = c["residual_ratio"]  # the online correction applied on top of the last fit
        return {"fixed": (c["c0"] + c["c_seq"]) * ratio, "per_token": c["c_tok"] * ratio,
                "per_token_past_knee": c["c_knee"] * ratio, "knee_tokens": c["knee"]}
