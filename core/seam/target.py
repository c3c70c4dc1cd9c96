"""What a drafter may know about the target it drafts for.

The engine builds one :class:`TargetContext` and hands it to the speculation
strategy and to every proposer factory, instead of the engine itself: a
drafter sees the target's weights, its KV pool and cache layout, the backend's
op table, and the limits of a request -- and nothing it could use to step the
engine, schedule, or reach into another proposer.

A remote draft worker builds one too, for a process that holds no target
model (``model`` and ``layout`` are None there): methods that need the target
in-process ask for it with :meth:`TargetContext.require_model`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from hyspec.errors import ConfigError

if TYPE_CHECKING:
    from hyspec.backend import Backend
    from hyspec.kv.pool import KVLayout, KVPool
    from hyspec.model.llama import CausalLM
    from hyspec.ops import OpTable
    from hyspec.seam.forward import ModelRunner


@dataclass(frozen=True)
class TargetContext:
    backend: "Backend"  # its op table, device, synchronize() and optimize_model() for drafter modules
    pool: "KVPool | None"  # the shared KV pool drafters register their layouts in (None: a weightless worker)
    vocab_size: int  # the target's vocabulary: every draft token must lie below it
    max_model_len: int  # the longest sequence a request may reach (prompt + output)
    dtype: torch.dtype
    model: "CausalLM | None" = None  # the target's weights (embedding, lm_head, config); None on a remote worker
    model_path: Path | None = None  # its checkpoint (a GGUF file or a Hugging Face directory)
    tokenizer: Any = None  # the target's tokenizer (draft_model checks the drafter shares it)
    layout: "KVLayout | None" = None  # the target's own pages in ``pool``
    runner: "ModelRunner | None" = None  # one packed target forward (start-up profiling only)
    max_num_seqs: int = 1  # the scheduler's batch limit (the dispatcher normalises load by it)
    #: ``(model, layout) -> StepGraphs`` for a drafter that runs a CausalLM through a ModelRunner (draft_model):
    #: its steps replay captured graphs like the target's; None where steps run eagerly
    step_graphs: Any = None

    @property
    def ops(self) -> "OpTable":
        return self.backend.ops

    @property
    def device(self) -> torch.device:
        return self.backend.device

    @property
    def config(self) -> Any:
        """The target's ModelConfig (layers, hidden size, ...); a method that reads it needs the model."""
        return self.require_model("this method").config

    def require_model(self, method: str) -> "CausalLM":
        if self.model is None:
            raise ConfigError("speculative_config.method",
                              f"{method} needs the target model in the same process (a remote draft worker "
                              "holds only the drafter)")
        return self.model
