"""What ``LLM.generate`` returns, shaped like vLLM's ``RequestOutput``."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop", "length", "abort" or None while running
    stop_reason: int | str | None = None  # the stop string or token id that ended it
    logprobs: list[dict] | None = None  # per token: {id: Logprob}, with SamplingParams.logprobs
    cumulative_logprob: float | None = None  # sum of the tokens' logprobs, with SamplingParams.logprobs

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_token_time: float | None = None
    finished_time: float | None = None
    num_spec_steps: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = field(default=None, repr=False)
    prompt_logprobs: list[dict | None] | None = None  # per prompt token (first None), with prompt_logprobs
    new_text: str = field(default="", repr=False)  # text added by the last step (for streaming)
    new_token_ids: list[int] = field(default_factory=list, repr=False)
    new_logprobs: list[dict] = field(default_factory=list, repr=False)  # logprobs of new_token_ids
