"""A request as the engine tracks it."""
from __future__ import annotations

import enum
import time

import torch

from hyspec.engine.outputs import RequestMetrics
from hyspec.engine.sampling_params import SamplingParams
from hyspec.kv.sequence_kv import SequenceKV
from hyspec.seam.processors import TokenProcessor


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """Token history, KV state and stop bookkeeping of one request.

    Invariant while running after prefill: the target's KV holds every token
    but the last (``num_cached == len(token_ids) - 1``); the last token is the
    root of the next step.
    """

    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                 params: SamplingParams, kv: SequenceKV, arm: str = "spec"):
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.token_ids = list(prompt_token_ids)  # prompt + output
        self.params = params
        self.kv = kv
        self.status = Status.WAITING
        self.arm = arm  # canary arm: "spec" may speculate, "control" never does
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.output_text = ""
        self.metrics = RequestMetrics(arrival_time=time.monotonic())
        self.generator: torch.Generator | None = None
        if params.seed is not None:
            self.generator = torch.Generator(device="cpu")
            self.generator.manual_seed(params.seed)
        self.detokenizer = None  # set by the engine
        # the request's logits processors (sampling controls, a grammar): run on the target's logits at every
        # position this request samples or verifies, committed with each step's tokens (hyspec.engine.controls)
        self.processors: list[TokenProcessor] = []
        self.num_preemptions = 0
        # logprobs (only when the request asks): one entry per output token, one per prompt token
        self.logprobs: list | None = [] if params.logprobs is not None else None
        self.cumulative_logprob: float | None = 0.0 if params.logprobs is not None else None
        self.prompt_logprobs: list | None = [None] if params.prompt_logprobs is not None else None
        # parallel sampling: samples of the same prompt wait here until this sequence's prefill is
        # done, then continue from a fork of its KV (``parallel_sampling.fork_waiting_samples``)
        self.followers: list["Sequence"] = []
        self.leader: "Sequence | None" = None  # set while this sample waits on another's prefill

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Prompt logprobs asked for and not all computed yet (a re-prefill does not redo them)."""
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < self.num_prompt_tokens

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_cached(self) -> int:
        return self.kv.num_tokens

    @property
    def in_prefill(self) -> bool:
        """Tokens other than the last still lack KV (a prompt, or a re-prefill after preemption)."""
        return self.kv.num_tokens < len(self.token_ids) - 1

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def __repr__(self) -> str:
        return f"Sequence({self.request_id!r}, {self.status.value}, tokens={len(self.token_ids)}, cached={self.num_cached})"
