"""``dspark``: DFlash's one-forward block, then the sequential decoder chooses and cuts it.

The backbone (shared with :class:`DFlashProposer`: context K/V in the pool,
one block forward) yields base logits and hidden states per slot; the
:class:`~hyspec.drafters.dspark.decoder.DSparkDecoder` walks them left to
right, adding the Markov bias of the token chosen before, drawing each token
from its processed q (argmax for greedy requests) with the request's
generator, and cutting the chain where verifying more is not worth it.  With
the Markov bias q_j depends on x_{j-1}: an ordinary autoregressive chain,
verified losslessly with the q_j recorded for each draft.
"""
from __future__ import annotations

from typing import Any

import torch

from hyspec.drafters.dflash.model import DFlashConfig
from hyspec.drafters.dflash.proposer import DFlashProposer, Live, block_uniforms
from hyspec.drafters.dspark.decoder import decode_block
from hyspec.drafters.dspark.model import DEFAULT_CUT_THRESHOLD, DEFAULT_RANK, DSparkDrafter
from hyspec.ops.sampling import SamplingTensors


class DSparkProposer(DFlashProposer):
    method = "dspark"

    @staticmethod
    def build_drafter(config: DFlashConfig, section: dict[str, Any], embed, lm_head, ops, max_positions):
        return DSparkDrafter(config, embed, lm_head, ops=ops, max_positions=max_positions,
                             markov_rank=int(section.get("markov_rank", DEFAULT_RANK)),
                             cut_threshold=float(section.get("cut_threshold", DEFAULT_CUT_THRESHOLD)))

    def select(self, live: list[Live], hidden: torch.Tensor, sampling: SamplingTensors
               ) -> list[tuple[list[int], torch.Tensor | None]]:
        drafter: DSparkDrafter = self.drafter
        slots = hidden[:, 1:]  # [B, K, H]
        base = drafter.logits(slots)  # [B, K, V]
        rows = sampling.select([lv.index for lv in live])
        uniforms = block_uniforms(live, base.shape[1]).to(base.device)
        roots = torch.tensor([lv.req.seq.last_token for lv in live], device=base.device)
        block = decode_block(drafter.decoder, base, slots, roots, rows, uniforms)
        lengths = block.cut(drafter.cut_threshold, [lv.k for lv in live])
        out = []
        for r, (lv, length) in enumerate(zip(live, lengths)):
            tokens = block.tokens[r, :length].tolist()
            out.append((tokens, None if lv.req.greedy else block.q[r, :length]))
        return out
