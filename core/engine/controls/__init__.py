"""Sampling controls as per-request logits processors (``hyspec.seam.processors.TokenProcessor``).

:func:`build_processors` turns a request's :class:`~hyspec.SamplingParams` into the list the
engine keeps on its sequence (``Sequence.processors``); plain decoding, verification and the
logprobs all run that list on the target's logits (docs/sampling_controls.md).
"""
from hyspec.engine.controls.build import build_processors, validate_ids

__all__ = ["build_processors", "validate_ids"]
