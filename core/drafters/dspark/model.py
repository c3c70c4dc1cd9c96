"""DSpark: a DFlash backbone plus the sequential decoder (Markov head + confidence head).

The backbone drafts base logits and hidden states for every block slot in one
forward, exactly as DFlash; :class:`~hyspec.drafters.dspark.decoder.DSparkDecoder`
then re-scores the slots left to right from the token chosen before each and
decides how long a prefix is worth verifying.  Saved with the DFlash layout
plus ``decoder.*`` tensors and ``markov_rank`` / ``cut_threshold`` in the
``hyspec_drafter`` section.
"""
from __future__ import annotations

import torch

from hyspec.drafters.dflash.model import DFlashConfig, DFlashDrafter
from hyspec.drafters.dspark.decoder import DSparkDecoder
from hyspec.errors import CheckpointError
from hyspec.ops import OpTable

DEFAULT_RANK = 32
DEFAULT_CUT_THRESHOLD = 0.1  # verify slot j while P(prefix up to j survives) >= 0.1


class DSparkDrafter(DFlashDrafter):
    def __init__(self, config: DFlashConfig, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor,
                 ops: OpTable | None = None, max_positions: int | None = None, markov_rank: int = DEFAULT_RANK,
                 cut_threshold: float = DEFAULT_CUT_THRESHOLD):
        super().__init__(config, embed_weight, lm_head_weight, ops=ops, max_positions=max_positions)
        if not 0.0 <= cut_threshold < 1.0:
            raise CheckpointError(f"DSpark cut_threshold must be in [0, 1), got {cut_threshold}")
        self.decoder = DSparkDecoder(config.layers.vocab_size, config.layers.hidden_size, markov_rank)
        self.markov_rank = markov_rank
        self.cut_threshold = cut_threshold

    def extra_config(self) -> dict:
        return {"markov_rank": self.markov_rank, "cut_threshold": self.cut_threshold}
