"""Is the ONNX Runtime drafter the torch drafter?  Logits compared over prefill, steps and a roll-back.

Tolerance (fp32): ``|onnx - torch| <= ATOL + RTOL * |torch|`` elementwise on
the logits.  Both run the same fp32 maths; ONNX Runtime fuses MatMul+Add,
blocks its GEMMs differently and evaluates softmax and RMSNorm with its own
reduction order, which changes each op's result by a few ulp (~1e-7
relative).  Through a few layers and an lm_head that sums over the hidden
size, logits of magnitude ~10 move by ~1e-6 (measured: 2.4e-7 on the tiny
test drafters).  1e-4 absolute + 1e-4 relative leaves two orders of
magnitude of headroom while still failing on any real mistake (a wrong
position, mask or head mapping moves logits by 1e-2 or more).

The torch side is the drafter's own cache-free forward
(``CausalLM.forward_dense``) over each row's whole sequence, so the check
covers the export (graph maths, positions, masks, cache growth) and the
runner's bookkeeping (ragged rows, holes, roll-back) together.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from hyspec.cpu_ops.onnx_drafter import OnnxDraftModel

ATOL = 1e-4
RTOL = 1e-4


@dataclass(frozen=True)
class LogitsCheck:
    max_abs_error: float  # max |onnx - torch| over every compared logit
    worst_ratio: float  # max |onnx - torch| / (ATOL + RTOL |torch|): <= 1 passes
    compared_rows: int  # logits rows compared (one per row per call)
    atol: float = ATOL
    rtol: float = RTOL

    @property
    def passed(self) -> bool:
        return self.worst_ratio <= 1.0


def check_against_torch(model, onnx: OnnxDraftModel, prompts: Sequence[Sequence[int]], steps: int = 8,
                        rollback_after: int | None = 3, rollback_tokens: int = 2) -> LogitsCheck:
    """Prefill ``prompts``, then ``steps`` greedy steps (torch's argmax fed to both); once, roll back.

    ``model`` is the hyspec ``CausalLM`` the ONNX graph was exported from.
    After step ``rollback_after`` every row forgets its last
    ``rollback_tokens`` tokens and re-feeds them as one ragged chunk, which
    exercises holes in the cache and multi-token feeds.
    """
    seqs = [list(p) for p in prompts]
    logits, state = onnx.prefill(seqs)
    errors: list[tuple[float, float]] = []
    compared = 0
    for step in range(steps + 1):
        expected = _torch_last_logits(model, seqs)  # [B, V]
        diff = (logits.double() - expected.double()).abs()
        bound = ATOL + RTOL * expected.double().abs()
        errors.append((float(diff.max()), float((diff / bound).max())))
        compared += len(seqs)
        if step == steps:
            break
        tokens = expected.argmax(dim=-1).tolist()
        for seq, token in zip(seqs, tokens):
            seq.append(token)
        if rollback_after is not None and step == rollback_after:
            keep = [max(1, len(s) - 1 - rollback_tokens) for s in seqs]  # state has len(s) - 1 tokens now
            state = onnx.rollback(state, keep)
            logits, state = onnx.feed([s[k:] for s, k in zip(seqs, keep)], state)
        else:
            logits, state = onnx.step(tokens, state)
    return LogitsCheck(max_abs_error=max(e for e, _ in errors), worst_ratio=max(r for _, r in errors),
                       compared_rows=compared)


@torch.no_grad()
def _torch_last_logits(model, seqs: list[list[int]]) -> torch.Tensor:
    rows = []
    for seq in seqs:
        hidden = model.forward_dense(torch.tensor([seq])).hidden[0, -1:]  # [1, H]
        rows.append(model.compute_logits(hidden)[0].float())
    return torch.stack(rows)


__all__ = ["ATOL", "LogitsCheck", "RTOL", "check_against_torch"]
