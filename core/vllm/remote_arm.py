"""Remote CPU drafting as an arm of hyspec's vLLM proposer: hyspec.remote's workers, inside vLLM's hook.

The drafting itself is hyspec.remote's :class:`~hyspec.remote.proposer.RemoteProposer`, unchanged: workers on
Ray CPU nodes (a local Ray started in vLLM's drafting process when ``ray_address`` is null), each hosting the
``remote.method`` drafter, pinged every ``ping_interval_ms`` (``max_missed_pings`` late: down, its rows fail over),
each step's answers awaited until ``draft_deadline_ms``, every answer checked before use.  What this module adds
is the translation: vLLM's rows (already identified as requests, core/vllm/requests.py) become the sequence views
the remote proposer reads, and its draft trees become the chains vLLM's hook takes.

Drafts are point proposals (``trust_worker_q`` stays off, workers are asked for greedy drafts): vLLM's rejection
sampler verifies a ``custom_class`` proposer's tokens without draft probabilities, so what a worker sends can cost
acceptance, never a token.  A late or dead worker leaves its rows without a draft for that step.  While no worker
is up at all (the cluster is not there, every worker failed over), :meth:`RemoteArm.draft` returns None and the
proposer drafts those rows with ``remote.fallback`` instead (or not at all).  The cluster missing at start-up is
logged once by hyspec.remote's factory and counted (``hyspec_remote_connect_failures_total``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from hyspec.drafters.methods import MethodSpec
from hyspec.remote.factory import build_remote_proposer
from hyspec.remote.health import UP
from hyspec.remote.proposer import RemoteOptions, RemoteProposer
from hyspec.remote.transport import WorkerHandle
from hyspec.seam.proposer import DraftRequest
from hyspec.seam.tree import DraftTree
from hyspec.spec.config import RemoteConfig
from hyspec.vllm.options import RemoteArmOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Greedy:
    """The sampling a worker drafts with: greedy (vLLM verifies the drafts as point proposals)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: None = None
    greedy: bool = True


GREEDY = _Greedy()


@dataclass(frozen=True)
class RemoteRow:
    """One request as the remote proposer reads it (hyspec.seam.views.SequenceView)."""

    request_id: str
    token_ids: list[int]  # prompt + output so far; the last one is the draft's root
    params: _Greedy = GREEDY
    generator: None = None
    in_prefill: bool = False

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]

    @property
    def num_cached(self) -> int:
        return len(self.token_ids) - 1


@dataclass(frozen=True)
class TargetShape:
    """What remote drafting needs to know of vLLM's target: no weights, only its vocabulary and context."""

    vocab_size: int
    max_model_len: int
    tokenizer: Any = None  # with get_vocab(): a worker whose drafter's vocabulary differs is refused by name


def _no_local_proposer(target: Any, spec: MethodSpec) -> None:
    """The remote factory's local builder, which builds nothing: the fallback is the vLLM proposer's own suffix or
    ngram, drafted in :class:`~hyspec.vllm.proposer.HyspecProposer`."""


class RemoteArm:
    """Drafts for a batch of requests on Ray CPU workers."""

    def __init__(self, options: RemoteArmOptions, num_speculative_tokens: int, target: TargetShape,
                 handles: list[WorkerHandle] | None = None, prompt_lookup: tuple[int, int] = (2, 5)):
        """``prompt_lookup``: an ngram worker's bounds; ``handles``: workers to use instead of spawning Ray's."""
        self.options = options
        o = options
        # fallback_method here only names the fallback in the factory's one "unavailable" message: the local
        # builder above builds nothing, and the vLLM proposer drafts the fallback itself
        config = RemoteConfig(ping_interval_ms=o.ping_interval_ms, max_missed_pings=o.max_missed_pings,
                              draft_deadline_ms=o.draft_deadline_ms, pipelining=o.pipelining,
                              fallback_method=o.fallback, trust_worker_q=False)
        spec = MethodSpec(o.method, o.model, num_speculative_tokens, *prompt_lookup, remote=config,
                          ray_address=o.ray_address)
        self.proposer: RemoteProposer = build_remote_proposer(
            target, spec, _no_local_proposer, RemoteOptions(o.num_workers, o.startup_timeout_s), handles)
        self.metrics = self.proposer.metrics

    def available(self) -> bool:
        """Whether any worker is up (else every row would be routed to the absent local fallback)."""
        with self.proposer._lock:
            return any(slot.state == UP for slot in self.proposer.slots)

    def draft(self, rows: list[tuple[str, list[int], int]]) -> list[list[int]] | None:
        """A chain (maybe empty: late, dead, no match) per ``(request id, tokens, budget)``; None when no worker
        is up, so the caller drafts these rows another way."""
        if not rows:
            return []
        if not self.available():
            return None
        requests = [DraftRequest(RemoteRow(rid, tokens), budget) for rid, tokens, budget in rows]
        trees = self.proposer.propose(requests, None)  # sampling is read only by a local fallback: there is none
        return [chain(tree) for tree in trees]

    def finish(self, request_id: str) -> None:
        """The request left vLLM's batch: its worker forgets it at the next call."""
        self.proposer.on_finish(RemoteRow(request_id, [0]))

    def health(self) -> float:
        return self.proposer.health()

    def workers(self) -> dict[str, dict[str, Any]]:
        """Each worker's state and last ping (pid included): for the metrics endpoint and drills."""
        with self.proposer._lock:
            return {s.name: {"state": s.state, "pid": s.stats.get("pid"), "misses": s.misses}
                    for s in self.proposer.slots}

    def close(self) -> None:
        self.proposer.close()


def chain(tree: DraftTree | None) -> list[int]:
    """The draft tokens of a chain; a tree is cut to its first path (a worker's drafter may build trees, vLLM's
    hook takes one chain)."""
    if tree is None:
        return []
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    path, node = [], 0
    for i in range(1, len(tokens)):
        if parents[i] == node:
            path.append(tokens[i])
            node = i
    return path
