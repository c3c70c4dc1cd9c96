"""``suffix``: suffix decoding (Snowflake's ArcticInference, vLLM's ``method: "suffix"``), no weights.

Three places a continuation can come from:

* the request's own tokens (its prompt and what it generated so far);
* a global cache of the responses of finished requests (``suffix_decoding_max_cached_requests``,
  oldest evicted first; 0 turns it off), which is where agents that re-run a step, or tools that
  ask for the same edit again, find their next tokens;
* a corpus shipped with the target (``suffix_decoding_corpus``, hyspec's key, read-only: see
  ``hyspec.drafters.suffix.corpus``): the target's own responses to other prompts, which a cold
  cache does not yet hold.

Per step and sequence: in each source, find the occurrences of the context's longest suffix (at
most ``suffix_decoding_max_tree_depth - 1`` tokens), then grow a tree from what followed them:
each candidate token's probability is the share of occurrences that continued that way, tokens
below ``suffix_decoding_min_token_prob`` are left out, the depth is at most
``suffix_decoding_max_spec_factor`` x the match length (and the tree depth minus it), and nodes are
taken most probable first up to the step's budget.  The source whose tree has the larger expected
number of accepted tokens (the sum of its nodes' probabilities) drafts; on a tie the request's own
tokens, then the cache, then the corpus (the nearer source is the surer guide).

The drafts are deterministic (``draft_probs=None``): the tree verifier treats each node's q as
one-hot, so acceptance at temperature 0 is the target's argmax and above it the target's own
probability, sibling after sibling -- lossless like every method.
"""
from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field
from typing import Sequence

from hyspec.drafters.suffix.store import TokenStore
from hyspec.ops.sampling import SamplingTensors
from hyspec.seam.proposer import DraftRequest, Proposer
from hyspec.seam.tree import DraftTree, NodeScores

#: where a draft came from (NodeScores.source): the request's own tokens, the cache of earlier responses,
#: or the corpus shipped with the target
OWN, CACHE, CORPUS = 0, 1, 2
#: occurrences per pattern kept by the stores (frequencies are estimated over the newest ones)
MAX_PER_KEY = 64


@dataclass(frozen=True)
class SuffixSettings:
    """vLLM's keys and meanings (``speculative_config.suffix_decoding_*``)."""

    max_tree_depth: int = 24  # match length + speculation length
    max_cached_requests: int = 10000  # finished responses in the global cache; 0: no global cache
    max_spec_factor: float = 1.0  # speculation length <= factor x match length
    min_token_prob: float = 0.1  # a token's share of the matched occurrences

    def __post_init__(self) -> None:
        if self.max_tree_depth < 2:
            raise ValueError(f"max_tree_depth must be >= 2 (a match and a token), got {self.max_tree_depth}")
        if self.max_cached_requests < 0:
            raise ValueError(f"max_cached_requests must be >= 0, got {self.max_cached_requests}")
        if not self.max_spec_factor > 0:
            raise ValueError(f"max_spec_factor must be > 0, got {self.max_spec_factor}")
        if not 0.0 <= self.min_token_prob <= 1.0:
            raise ValueError(f"min_token_prob must be in [0, 1], got {self.min_token_prob}")


@dataclass
class Draft:
    tokens: list[int]  # draft nodes in order (the root excluded)
    parents: list[int]  # parent of each node: 0 = the root, i = the i-th node (1-based)
    score: float  # the sum of the nodes' probabilities: expected accepted tokens
    match_length: int
    conditional: list[float] = field(default_factory=list)  # each node's share of its parent's occurrences
    source: int = 0  # OWN or CACHE


def grow_tree(continuations: list[list[int]], budget: int, min_prob: float) -> Draft:
    """The most probable nodes (up to ``budget``) of the trie of ``continuations``, parents first.

    The trie is built node by node (token -> child per node), in time linear in the continuations'
    total length: keying nodes by their whole path cost time quadratic in the depth, which at a tree
    depth of 48 made drafting dearer than the verification it saves."""
    total = len(continuations)
    if total == 0 or budget < 1:
        return Draft([], [], 0.0, 0)
    kids: list[dict[int, int]] = [{}]  # trie node -> {token: child node}, in first-seen order
    count = [total]  # occurrences that went through each trie node (the root: all of them)
    token = [-1]
    for cont in continuations:
        node = 0
        for t in cont:
            child = kids[node].get(t)
            if child is None:
                child = kids[node][t] = len(count)
                kids.append({})
                count.append(0)
                token.append(t)
            count[child] += 1
            node = child
    tokens, parents, conditional, score = [], [], [], 0.0
    order = itertools.count()  # ties: the continuation seen first (the most recent occurrence) wins
    # heap entries: (-probability, tie order, trie node, its trie parent, the draft node index of that parent)
    heap = [(-count[c] / total, next(order), c, 0, 0) for c in kids[0].values() if count[c] / total >= min_prob]
    heapq.heapify(heap)
    while heap and len(tokens) < budget:
        neg, _, trie_node, trie_parent, parent = heapq.heappop(heap)
        tokens.append(token[trie_node])
        parents.append(parent)
        conditional.append(count[trie_node] / count[trie_parent])
        score += -neg
        node = len(tokens)
        for child in kids[trie_node].values():
            if count[child] / total >= min_prob:
                heapq.heappush(heap, (-count[child] / total, next(order), child, trie_node, node))
    return Draft(tokens, parents, score, 0, conditional)


class SuffixProposer(Proposer):
    method = "suffix"
    builds_trees = True
    scores_drafts = True
    drafts_rows_independently = True

    def __init__(self, settings: SuffixSettings, max_tokens: int, vocab_size: int,
                 corpus: "Sequence[Sequence[int]] | None" = None):
        self.settings = settings
        self.max_tokens = max_tokens
        self.vocab_size = vocab_size
        self._own: dict[str, TokenStore] = {}  # request id -> its prompt and output so far
        self.cache = TokenStore(MAX_PER_KEY)  # finished responses (global)
        self._serials = itertools.count()
        self.corpus: TokenStore | None = None  # read-only: never evicted, kept by forget_shared_history
        if corpus:
            self.corpus = TokenStore(MAX_PER_KEY)
            for serial, tokens in enumerate(corpus):
                if tokens and not (min(tokens) >= 0 and max(tokens) < vocab_size):  # C builtins: 243k tokens
                    raise ValueError(f"suffix corpus sequence {serial}: a token id outside the target's "
                                     f"vocabulary of {vocab_size}")
                self.corpus.extend(serial, list(tokens))
        # branching_drafts: drafts with a node of two or more children (trees, not chains)
        self.stats = {"drafts_own": 0, "drafts_cache": 0, "drafts_corpus": 0, "branching_drafts": 0,
                      "cached_responses": 0, "evicted_responses": 0}

    def max_budget(self) -> int:
        return self.max_tokens

    def propose(self, requests: list[DraftRequest], sampling: SamplingTensors) -> list[DraftTree | None]:
        out: list[DraftTree | None] = []
        for req in requests:
            context = req.seq.token_ids
            own = self._own_store(req.seq)
            budget = min(req.budget, self.max_tokens)
            best = self.draft(own, context, budget, exclude_end=(0, len(context) - 1))
            if self.settings.max_cached_requests:
                cached = self.draft(self.cache, context, budget)
                cached.source = CACHE
                if cached.score >= best.score:  # ties: an earlier response of a re-run request is the surer guide
                    best = cached
            if self.corpus is not None:
                shipped = self.draft(self.corpus, context, budget)
                shipped.source = CORPUS
                if shipped.score > best.score:  # ties: the request's own tokens and its server's history first
                    best = shipped
            if best.tokens:
                self.stats[("drafts_own", "drafts_cache", "drafts_corpus")[best.source]] += 1
            self.stats["branching_drafts"] += len(set(best.parents)) < len(best.parents)
            out.append(self._tree(req.seq.last_token, best) if best.tokens else None)
        return out

    def match_length(self, seq, cap: int) -> int:
        """The longest suffix of ``seq``'s tokens (at most ``cap``, and short of the tree depth) found in
        its own earlier tokens, in the cache of earlier responses or in the corpus."""
        context = seq.token_ids
        cap = min(cap, self.settings.max_tree_depth - 1)
        n = self._own_store(seq).longest_match(context, cap, exclude_end=(0, len(context) - 1)).length
        if self.settings.max_cached_requests and n < cap:
            n = max(n, self.cache.longest_match(context, cap).length)
        if self.corpus is not None and n < cap:
            n = max(n, self.corpus.longest_match(context, cap).length)
        return n

    def draft(self, store: TokenStore, context: list[int], budget: int,
              exclude_end: tuple[int, int] | None = None) -> Draft:
        """The best tree ``store`` offers for ``context`` under ``budget`` nodes.

        The match and the speculation share ``max_tree_depth``, so the longest match is not always
        the best one to draft from: a match of m tokens allows ``min(max_tree_depth - m,
        max_spec_factor * m)`` tokens, largest near ``max_tree_depth / (1 + max_spec_factor)``.  The
        longest match and that length are both tried (the shorter one's occurrences: those of the
        longest match's q-gram bucket that match at least m tokens, which is all of them when
        m >= QGRAM, as at the defaults), and the tree with the larger expected acceptance wins."""
        s = self.settings
        match = store.longest_match(context, s.max_tree_depth - 1, exclude_end)
        if match.length == 0:
            return Draft([], [], 0.0, 0)
        balanced = max(1, min(match.length, round(s.max_tree_depth / (1.0 + s.max_spec_factor))))
        best = Draft([], [], 0.0, match.length)
        for m in dict.fromkeys((match.length, balanced)):
            depth = min(s.max_tree_depth - m, math.floor(s.max_spec_factor * m))
            if depth < 1:
                continue
            ends = match.ends if m == match.length else match.ends_at_least(m)
            draft = grow_tree(store.continuations(ends[::-1], depth), budget, s.min_token_prob)  # newest first
            draft.match_length = m
            if draft.score > best.score:
                best = draft
        return best

    def _tree(self, root: int, draft: Draft) -> DraftTree:
        return DraftTree([root, *draft.tokens], [-1, *draft.parents], vocab_size=self.vocab_size,
                         scores=NodeScores(tuple(draft.conditional), draft.source, draft.match_length))

    def _own_store(self, seq) -> TokenStore:
        """The request's tokens, indexed: created at its first draft, extended as it generates."""
        store = self._own.get(seq.request_id)
        tokens = seq.token_ids
        if store is None or len(store.sequences[0]) > len(tokens):  # new, or rewound (cannot happen today)
            store = self._own[seq.request_id] = TokenStore(MAX_PER_KEY)
            store.extend(0, list(tokens))
            return store
        known = len(store.sequences[0])
        if known < len(tokens):
            store.extend(0, tokens[known:])
        return store

    def on_finish(self, seq) -> None:
        """Release the request's store; its response joins the global cache (oldest evicted first)."""
        self._own.pop(seq.request_id, None)
        response = seq.output_token_ids
        if not self.settings.max_cached_requests or not response:
            return
        self.cache.extend(next(self._serials), list(response))
        self.stats["cached_responses"] += 1
        while len(self.cache) > self.settings.max_cached_requests:
            self.cache.evict_oldest()
            self.stats["evicted_responses"] += 1

    def forget_shared_history(self) -> None:
        """Empty the global cache of responses (benchmarks, between timed passes); the corpus, which ships
        with the target like a drafter's weights, stays."""
        self.cache = TokenStore(MAX_PER_KEY)

    def on_preempt(self, seq) -> None:
        """The target recomputes the request's KV; its tokens (all this drafter holds) are unchanged."""

    def memory_bytes(self) -> int:
        """What the global cache, the corpus and the live requests' stores hold (an estimate)."""
        corpus = self.corpus.memory_bytes() if self.corpus is not None else 0
        return self.cache.memory_bytes() + corpus + sum(s.memory_bytes() for s in self._own.values())
