"""The logprobs a step owes its requests: prompt tokens from prefill rows, emitted tokens from the row
that committed each one (``hyspec.engine.logprobs`` has the numbers' definition)."""
from __future__ import annotations

from typing import Callable

import torch

from hyspec.engine.logprobs import TokenLogprobs, log_distribution, token_logprobs
from hyspec.engine.sequence import Sequence
from hyspec.seam.forward import ALL_LOGITS
from hyspec.seam.step import TargetRun

TokenText = Callable[[int], "str | None"]


def record_prompt_logprobs(run: TargetRun, mode: str, token_text: TokenText) -> None:
    """Append to each asking sequence the logprobs of the prompt tokens its prefill rows predict
    (row j of a chunk starting at position s scores prompt token s + j + 1)."""
    for i, (row, feed) in enumerate(zip(run.rows, run.feeds)):
        seq = row.seq
        if row.kind.decodes or not seq.wants_prompt_logprobs or feed.logits != ALL_LOGITS:
            continue
        first = max(len(seq.prompt_logprobs), feed.start + 1)  # prompt position of the first token to score
        last = min(seq.num_prompt_tokens, feed.start + len(feed.tokens) + 1)  # one past this chunk's last
        if first >= last:
            continue
        logits = run.result.feed_logits(i)[first - 1 - feed.start:last - 1 - feed.start]
        logp = log_distribution(logits, [seq.params] * logits.shape[0], mode)
        seq.prompt_logprobs += token_logprobs(logp, seq.prompt_token_ids[first:last],
                                              [seq.params.prompt_logprobs] * (last - first), token_text)


def score_tokens(scored: list[tuple[Sequence, torch.Tensor]], tokens: dict[str, list[int]], mode: str,
                 token_text: TokenText) -> dict[str, list[TokenLogprobs]]:
    """Per request id: the logprobs of its new tokens; ``scored`` pairs each asking sequence with the
    logits rows its tokens were committed from (one row per token, in order)."""
    if not scored:
        return {}
    params = [s.params for s, rows in scored for _ in range(rows.shape[0])]
    logp = log_distribution(torch.cat([rows for _, rows in scored]), params, mode)
    ids = [t for s, _ in scored for t in tokens[s.request_id]]
    entries = token_logprobs(logp, ids, [p.logprobs for p in params], token_text)
    out, at = {}, 0
    for s, rows in scored:
        out[s.request_id] = entries[at:at + rows.shape[0]]
        at += rows.shape[0]
    return out
