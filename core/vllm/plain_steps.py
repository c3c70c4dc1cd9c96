"""Steps where no request has drafts take vLLM's plain path.

With a ``speculative_config``, vLLM's model runner treats every step as speculative, drafts or none: it builds
spec-decode metadata, samples through the rejection sampler and gathers the bonus logits apart
(vllm/v1/worker/gpu_model_runner.py, ``_prepare_inputs`` and ``_sample``, vLLM 0.32).  Where hyspec's hybrid
sends nothing (a batch at which drafting does not pay), that is a cost plain vLLM does not have: measured
interleaved on the 2-core VM with nothing sent, chat at batch 8 ran at 0.970x vLLM plain and at batch 32 at
0.988x (docs/results/2026-12-06/vllm-hybrid/).

So the runner that hosts hyspec's proposer prepares a step whose scheduler output carries no draft tokens as if
speculation were off: ``_prepare_inputs`` returns no spec-decode metadata and ``_sample`` takes vLLM's own
sampler, as in a plain engine.  Everything else (the proposer's call, the scheduler's bookkeeping) is unchanged,
and a step with drafts is untouched.  The token a step without drafts samples is the one plain vLLM's sampler
gives: the rejection sampler with no draft tokens samples only its bonus token with that same sampler.

Applied only where the runner's code is the one this was read from (its ``_prepare_inputs`` decides on
``self.speculative_config`` as vLLM 0.32 does) and the model keeps no recurrent state (Mamba / linear-attention
layers read a zero-draft decode as a speculative row: vLLM's comment in ``_prepare_inputs``); elsewhere it is
left off and logged once.
"""
from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

log = logging.getLogger(__name__)
#: the line of vLLM 0.32's ``_prepare_inputs`` whose decision this changes
DECISION = "use_spec_decode = self.speculative_config is not None"


def why_not(runner: Any) -> str | None:
    """None when the plain path can be given to ``runner``'s steps without drafts, else the reason."""
    prepare = getattr(type(runner), "_prepare_inputs", None)
    if prepare is None or not hasattr(runner, "speculative_config"):
        return "the caller is not vLLM's model runner"
    try:
        source = inspect.getsource(prepare)
    except (OSError, TypeError):
        return "vLLM's _prepare_inputs has no readable source"
    if DECISION not in source or list(inspect.signature(prepare).parameters)[1:3] != [
            "scheduler_output", "num_scheduled_tokens"]:
        return "this vLLM's _prepare_inputs is not the one hyspec was checked against (vLLM 0.32)"
    model_config = getattr(getattr(runner, "vllm_config", None), "model_config", None)
    if getattr(model_config, "is_hybrid", False) or getattr(model_config, "has_inner_state", False):
        return "the model keeps recurrent state, whose zero-draft decode vLLM runs as a speculative row"
    return None


def take_plain_path_without_drafts(runner: Any, counter: dict[str, int]) -> bool:
    """Wrap ``runner._prepare_inputs`` (this runner only) so a step with no draft tokens is prepared as plain
    vLLM prepares it; ``counter["plain_path_steps"]`` counts those steps.  False (and logged) where it cannot."""
    reason = why_not(runner)
    if reason is not None:
        log.info("hyspec: steps without drafts keep vLLM's speculative path (%s)", reason)
        return False
    original = runner._prepare_inputs
    if getattr(original, "hyspec_plain_steps", False):
        return True

    @functools.wraps(original)
    def prepare(scheduler_output: Any, num_scheduled_tokens: Any) -> Any:
        if scheduler_output.scheduled_spec_decode_tokens:
            return original(scheduler_output, num_scheduled_tokens)
        speculative_config, runner.speculative_config = runner.speculative_config, None
        try:
            return original(scheduler_output, num_scheduled_tokens)
        finally:
            runner.speculative_config = speculative_config
            counter["plain_path_steps"] = counter.get("plain_path_steps", 0) + 1

    prepare.hyspec_plain_steps = True  # type: ignore[attr-defined]
    runner._prepare_inputs = prepare
    return True
