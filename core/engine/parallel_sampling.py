"""``n`` and ``best_of``: one request fanned out into one engine request per sample, and back.

The engine runs one completion per request.  A request with ``n`` (or
``best_of``) samples becomes ``best_of or n`` engine requests: sample 0 is
queued as usual, the others name it in ``share_prompt_with`` and continue from
a fork of its KV once its prefill is done (the prompt is computed once, its
full pages shared).  Their completions are gathered back into one answer of
``n`` choices: all of them, or -- when ``best_of`` > ``n`` -- the ``n`` with
the highest mean token logprob (OpenAI's "highest log probability per token").
``LLM.generate`` and the server both go through here.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hyspec.engine.outputs import CompletionOutput
from hyspec.engine.sampling_params import SamplingParams
from hyspec.engine.sequence import Sequence, Status
from hyspec.kv.pool import OutOfKVBlocks

if TYPE_CHECKING:
    from hyspec.engine.scheduler import Scheduler
    from hyspec.seam.step import TargetRun

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SampleRequest:
    request_id: str
    params: SamplingParams
    share_prompt_with: str | None  # sample 0's id for every later sample


def fan_out(request_id: str, params: SamplingParams) -> list[SampleRequest]:
    """The engine requests of one request: a single one when it wants one sample."""
    if params.num_samples == 1:
        return [SampleRequest(request_id, params, None)]
    ids = [f"{request_id}-s{i}" for i in range(params.num_samples)]
    return [SampleRequest(rid, params.for_sample(i), None if i == 0 else ids[0]) for i, rid in enumerate(ids)]


def mean_logprob(out: CompletionOutput) -> float:
    if out.cumulative_logprob is None or not out.token_ids:
        return float("-inf")
    return out.cumulative_logprob / len(out.token_ids)


def select(params: SamplingParams, samples: list[CompletionOutput]) -> list[CompletionOutput]:
    """The ``n`` completions to return (indexed 0..n-1) out of the finished samples."""
    chosen = list(samples)
    if params.num_samples > params.n:
        # stable: among equal scores the earlier sample wins, so the choice is reproducible
        chosen = sorted(chosen, key=mean_logprob, reverse=True)[:params.n]
    strip = params.logprobs is None  # logprobs were only computed to rank best_of's samples
    return [dataclasses.replace(c, index=i, logprobs=None if strip else c.logprobs,
                                cumulative_logprob=None if strip else c.cumulative_logprob)
            for i, c in enumerate(chosen)]


def fork_waiting_samples(run: "TargetRun", requests: dict[str, Sequence], scheduler: "Scheduler") -> None:
    """Prompts whose prefill ended in ``run`` hand their KV to the samples waiting on them.

    A sample continues from ``SequenceKV.fork()`` (full pages shared, the partial one copied) and
    joins the running batch; one that finds no page for its copy, or no room in the batch, prefills
    its own prompt instead.  ``run.forks`` is left holding the samples that were forked: they draw
    their first token from the prefill's last row and receive its hidden states.
    """
    for leader_id, followers in list(run.forks.items()):
        leader = requests.get(leader_id)
        forked = []
        for f in followers:
            if f.finished or leader is None:
                continue
            try:
                if len(scheduler.running) >= scheduler.config.max_num_seqs:
                    raise OutOfKVBlocks("no room in the batch")
                f.kv = leader.kv.fork()
            except OutOfKVBlocks:
                log.info("%s prefills its own prompt (no room to share %s's)", f.request_id, leader_id)
                scheduler.add(f)
            else:
                f.status = Status.RUNNING
                scheduler.running.append(f)
                if leader.prompt_logprobs is not None and f.prompt_logprobs is not None:
                    f.prompt_logprobs = list(leader.prompt_logprobs)
                forked.append(f)
            f.leader = None
        if leader is not None:
            leader.followers = []
        run.forks[leader_id] = forked
