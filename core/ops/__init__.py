"""The op table: one pure-torch reference per op, optional backend versions by name.

Model and speculative code call ops only through an ``OpTable``
(``ops.attention(...)``), never by backend name.  A backend starts from
``reference_ops()`` and overrides the ops it has a faster version of; every
override is checked against the reference by the conformance suite.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from hyspec.ops.attention import AttentionMetadata, paged_attention
from hyspec.ops.kv import compact_kv, write_kv
from hyspec.ops.logits import compute_logits
from hyspec.ops.norm import rms_norm
from hyspec.ops.rejection import rejection_sample
from hyspec.ops.rotary import rotary
from hyspec.ops.sampling import sample

REFERENCE = "reference"

#: The op names every table has (docs/architecture.md §3).  The references live in this
#: package, which imports nothing from the speculative layer above it (tests/test_ops_layering.py).
OP_NAMES = ("attention", "write_kv", "compact_kv", "rms_norm", "rotary", "logits", "sample", "rejection_sample")


@dataclass(frozen=True)
class OpTable:
    """Callable ops plus where each one comes from (``"reference"``, ``"triton"``, ...)."""

    attention: Callable = paged_attention
    write_kv: Callable = write_kv
    compact_kv: Callable = compact_kv
    rms_norm: Callable = rms_norm
    rotary: Callable = rotary
    logits: Callable = compute_logits  # (hidden [..., H], lm_head weight [V, H]) -> [..., V] fp32
    sample: Callable = sample
    rejection_sample: Callable = rejection_sample
    sources: dict[str, str] = field(default_factory=lambda: {name: REFERENCE for name in OP_NAMES})

    def with_overrides(self, source: str, **ops: Callable) -> "OpTable":
        """A copy where the named ops are replaced by ``source``'s versions."""
        unknown = set(ops) - set(OP_NAMES)
        if unknown:
            raise KeyError(f"unknown op(s) {sorted(unknown)}; ops are {list(OP_NAMES)}")
        sources = dict(self.sources)
        sources.update({name: source for name in ops})
        return replace(self, sources=sources, **ops)

    def native_ops(self) -> list[str]:
        return [n for n in OP_NAMES if self.sources[n] != REFERENCE]


def reference_ops() -> OpTable:
    return OpTable()


__all__ = ["AttentionMetadata", "OpTable", "OP_NAMES", "REFERENCE", "reference_ops"]
