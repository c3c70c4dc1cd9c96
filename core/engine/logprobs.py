"""Log-probabilities of sampled and prompt tokens, shaped like vLLM's ``Logprob``.

Every number comes from the *target's* logits of the step that committed the
token: a plain decode row, the final row of a prefill, or -- for a token
accepted from a draft -- the verification forward's row at the token's parent
node.  The drafter's distribution never appears here, so a request's logprobs
are the ones plain decoding reports, whichever method produced its tokens (up
to the rounding of a differently shaped forward; ``docs/api.md``).

Two modes, as vLLM's ``logprobs_mode``:

* ``raw_logprobs`` (default): ``log_softmax`` of the model's logits, before
  temperature and filters -- what evaluation harnesses score with;
* ``processed_logprobs``: of the distribution the request samples from
  (temperature, top-k, top-p, min-p applied; filtered tokens are ``-inf``).
  Greedy rows report raw logprobs (temperature 0 is not a distribution).

A request's sampling controls (``hyspec.engine.controls``) are in the processed numbers only: the
engine hands this module the controlled rows in ``processed_logprobs`` mode (for greedy rows that is
``log_softmax`` of the controlled logits, vLLM's all-greedy case) and the model's rows in ``raw_logprobs``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from hyspec.ops.sampling import SamplingTensors, process_logits

if TYPE_CHECKING:
    from hyspec.engine.sampling_params import SamplingParams

RAW, PROCESSED = "raw_logprobs", "processed_logprobs"
LOGPROBS_MODES = (RAW, PROCESSED)


@dataclass(frozen=True)
class Logprob:
    """One token's log-probability, its rank in the vocabulary (1 = most likely) and its text."""

    logprob: float
    rank: int
    decoded_token: str | None = None


#: per position: token id -> Logprob (the scored token first, then the top k)
TokenLogprobs = dict[int, Logprob]


def log_distribution(logits: torch.Tensor, params: list["SamplingParams"], mode: str) -> torch.Tensor:
    """``logits [R, V]`` -> fp32 log-probabilities [R, V] of each row's request, in ``mode``."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    if mode == RAW or all(p.greedy for p in params):
        return logp
    st = SamplingTensors.from_params(params, device=logits.device)
    processed = process_logits(logits, st.temperature, st.top_k, st.top_p, st.min_p).log()
    greedy = torch.tensor([p.greedy for p in params], device=logits.device)
    return torch.where(greedy[:, None], logp, processed)


def token_logprobs(logp: torch.Tensor, tokens: list[int], top_k: list[int],
                   decode: Callable[[int], str | None]) -> list[TokenLogprobs]:
    """Per row ``r``: ``tokens[r]``'s Logprob plus the ``top_k[r]`` most likely tokens' (vLLM's layout:
    the scored token first, so the dict has k or k + 1 entries).  Ranks count tokens strictly more
    likely, plus one; a tie shares the better rank."""
    if not tokens:
        return []
    index = torch.tensor(tokens, dtype=torch.int64, device=logp.device)
    chosen = logp.gather(1, index[:, None]).squeeze(1)
    ranks = (logp > chosen[:, None]).sum(1) + 1
    k_max = max(top_k)
    top_vals = top_ids = None
    if k_max > 0:
        top_vals, top_ids = logp.topk(min(k_max, logp.shape[1]), dim=1)
        top_vals, top_ids = top_vals.tolist(), top_ids.tolist()
    chosen_l, ranks_l = chosen.tolist(), ranks.tolist()
    out: list[TokenLogprobs] = []
    for r, tok in enumerate(tokens):
        entry = {tok: Logprob(chosen_l[r], ranks_l[r], decode(tok))}
        for j in range(top_k[r]):
            t = top_ids[r][j]
            if t not in entry:
                entry[t] = Logprob(top_vals[r][j], j + 1, decode(t))
        out.append(entry)
    return out
