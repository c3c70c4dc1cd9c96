"""Which request each batch row holds, and what hyspec keeps per request between vLLM's steps.

vLLM's ``custom_class`` hook passes batch rows, not request ids, and rows move as requests finish and join.
State that must follow a request (its indexed tokens, its last draft, its response when it ends) is keyed by
request id, read from the caller: vLLM's model runner calls ``propose`` from its own
``propose_draft_token_ids``, whose ``self.input_batch.req_ids[i]`` is row ``i``'s request (vLLM 0.32,
``vllm/v1/worker/gpu_model_runner.py``; its built-in suffix proposer is handed that input batch directly).
Any other caller, or a batch that does not line up with the rows, gives no identity: the proposer then drafts
from each row's own tokens alone, which is always correct, and counts the step.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from hyspec.drafters.suffix.proposer import MAX_PER_KEY
from hyspec.drafters.suffix.store import TokenStore
from hyspec.policy.wave import WaveTracker


@dataclass(frozen=True)
class RowIdentity:
    request_ids: list[str]
    prompt_lengths: list[int]
    max_tokens: list[int | None] = field(default_factory=list)  # each request's output budget (None: unknown)


def identify_rows(num_rows: int, depth: int = 2) -> RowIdentity | None:
    """The request id and prompt length of each of ``num_rows`` rows, from the model runner ``depth`` frames up
    (the frame that called ``propose``); None when the caller is not a runner with a matching input batch."""
    try:
        caller = sys._getframe(depth).f_locals.get("self")
    except ValueError:  # called from the top of the stack
        return None
    batch = getattr(caller, "input_batch", None)
    ids = getattr(batch, "req_ids", None)
    prompt_lengths = getattr(batch, "num_prompt_tokens", None)
    if ids is None or prompt_lengths is None or len(ids) < num_rows or any(i is None for i in ids[:num_rows]):
        return None
    states = getattr(caller, "requests", None)  # the runner's CachedRequestState by request id
    return RowIdentity([str(i) for i in ids[:num_rows]], [int(n) for n in prompt_lengths[:num_rows]],
                       [_max_tokens(states, i) for i in ids[:num_rows]])


def _max_tokens(states: object, request_id: object) -> int | None:
    state = states.get(request_id) if isinstance(states, dict) else None
    value = getattr(getattr(state, "sampling_params", None), "max_tokens", None)
    return int(value) if isinstance(value, int) else None


@dataclass
class LiveRequest:
    """One request's tokens as hyspec has seen them (indexed for suffix matching) and its last draft."""

    prompt_length: int
    request_id: str = ""
    tokens: list[int] = field(default_factory=list)
    store: TokenStore = field(default_factory=lambda: TokenStore(MAX_PER_KEY))
    last_draft: int = 0  # tokens proposed at the request's previous step (its acceptance comes back next step)
    last_method: str = ""  # what drafted them (the draft-quality alerts are per method)
    arm: str = ""  # the canary's: "spec" (may draft) or "control" (decoded without drafts); "" until decided

    def catch_up(self, context: Sequence[int]) -> bool:
        """Index what ``context`` adds to the known tokens; False (nothing changed) when the known tokens are not
        a prefix of it, which means the row is not this request's and the caller must start afresh."""
        known = len(self.tokens)
        if known > len(context) or (known and (context[0] != self.tokens[0] or context[known - 1] != self.tokens[-1])):
            return False
        if known < len(context):
            new = [int(t) for t in context[known:]]
            self.tokens.extend(new)
            self.store.extend(0, new)
        return True


class RequestTable:
    """Live requests by id; those that leave the batch are handed back once, as finished."""

    def __init__(self) -> None:
        self.live: dict[str, LiveRequest] = {}
        self.waves = WaveTracker()  # the step each request in the batch first appeared in

    def follow(self, identity: RowIdentity) -> list[LiveRequest]:
        """Requests no longer in the batch (finished, aborted or preempted), removed from the table."""
        self.waves.follow(identity.request_ids)
        present = set(identity.request_ids)
        gone = [rid for rid in self.live if rid not in present]
        return [self.live.pop(rid) for rid in gone]

    def row(self, request_id: str, prompt_length: int, context: Sequence[int]) -> LiveRequest:
        """``request_id``'s state brought up to ``context``; new (or rebuilt) if unknown or inconsistent."""
        live = self.live.get(request_id)
        if live is None or not live.catch_up(context):
            live = self.live[request_id] = LiveRequest(prompt_length, request_id)
            live.catch_up(context)
        return live

    def memory_bytes(self) -> int:
        return sum(r.store.memory_bytes() for r in self.live.values())
