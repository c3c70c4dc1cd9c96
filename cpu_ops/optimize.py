"""What the CPU backend does to a loaded model before serving it."""
from __future__ import annotations

import logging

from torch import nn

from hyspec.cpu_ops.packed_linear import pack_linears

log = logging.getLogger(__name__)


def optimize_for_cpu(model: nn.Module) -> nn.Module:
    """Pack linear weights (see packed_linear.py); models keep their interface.

    The linear layers are the one thing the backend provides as swappable
    modules: every ``nn.Linear`` becomes a :class:`PackedLinear` (same
    ``weight``/``bias``, same call).  Nothing else of the model is touched: the
    lm-head matmul (the target's, tied embeddings included, and the drafters'
    that share it) is the op table's ``logits`` op, which the CPU backend
    serves from packed copies (``packed_linear.packed_logits``).  A CausalLM whose
    projections are GGUF blocks (fp32 activations) or dense fp32 / bf16 weights on
    hyspec's batch-invariant kernel also gets a ``layer_stack`` (decoder_stack.py):
    its layers then run in one C call per forward.  Idempotent.
    """
    packed = pack_linears(model)
    log.debug("packed %d linear layers of %s for the CPU", packed, type(model).__name__)
    if hasattr(model, "layer_stack"):  # a CausalLM: where the stack can run it, its layers run in one C call
        from hyspec.cpu_ops.decoder_stack import attach

        attach(model)
    return model
