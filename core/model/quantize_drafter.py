"""Drafter linears on the backend's weight-only kernels (``speculative_config.quantization``).

Why.  A drafter is run once per drafted token, so its weight bytes are paid per token, like the
target's.  The target reads its GGUF's 4-bit codes (92 MiB a step for SmolLM2-135M); the trained
drafters were stored int8 but ran dense fp32, so an EAGLE-3 head step read 39 MB: its decoder layer,
feature fusion and 8,192-row lm_head, 40 % of a target step for one drafted token.  On the 2-core Intel
VM its draft step took 2.97 ms dense and 1.79 ms with the same linears as int8 blocks (EAGLE-3, one
drafted token a step, HumanEval; acceptance 0.230 vs 0.226 over ~920 drafts).

What.  Every ``nn.Linear`` of a drafter module (not the target's tensors a drafter only holds by
reference: the shared embedding and lm_head stay the target's own, already quantized by the loader)
is quantized here from its dense values, llama.cpp's Q8_0 (``int8``) or Q4_1 (``int4``) per group of
32 (hyspec.model.quant.quantize), and handed to ``backend.quantized_linear``:

* ``None`` (the default): int8 where the backend has a kernel for every layer of the drafter, else the
  whole drafter dense (the 80-wide draft model, whose 6 of 8 linears cannot be int8, was slower mixed);
* ``"none"``: every layer dense (the drafter's reference numerics);
* ``"int8"`` / ``"int4"``: demanded; a layer the backend cannot compute that way is an error naming it.

Lossless either way: a drafter's numerics only change which tokens it proposes (its acceptance),
never what is committed, which verification against the target decides.  At temperature > 0 the
draft distribution used in rejection sampling is the one the draft was sampled from, quantized or not.
Vendor-neutral: the kernels are the backend's.
"""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import torch
from torch import nn

from hyspec.errors import ConfigError
from hyspec.model.quant import quantize

if TYPE_CHECKING:
    from hyspec.backend import Backend

DRAFTER_QUANTIZATION_CHOICES = ("none", "int8", "int4")
_BITS = {"int8": 8, "int4": 4}
_GROUP = 32  # the block of Q8_0 / Q4_1


def quantize_drafter(module: nn.Module, quantization: str | None, backend: "Backend") -> Counter:
    """Swap ``module``'s ``nn.Linear`` layers for the backend's quantized ones, in place.

    Returns how many layers ended up as what (``"int8"``, ``"dense"``, ``"dense (in_features 80 not a
    multiple of 32)"`` ...).  By default a drafter is quantized whole or not at all (one layer that cannot
    be keeps them all dense).  Call it before ``backend.optimize_model``, which packs what stays dense.
    """
    if quantization is not None and quantization not in DRAFTER_QUANTIZATION_CHOICES:
        raise ConfigError("speculative_config.quantization",
                          f"must be one of {', '.join(DRAFTER_QUANTIZATION_CHOICES)} or null; got {quantization!r}")
    kinds: Counter = Counter()
    demanded = quantization is not None
    bits = _BITS.get(quantization or "int8")
    swaps = []
    for path, parent, name, linear in _linears(module):
        if quantization == "none":
            kinds["dense"] += 1
            continue
        weight = linear.weight
        why = _unquantizable(weight)
        replacement = None
        if why is None:
            replacement = backend.quantized_linear(quantize(weight, bits), linear.bias, weight.dtype)
            why = None if replacement is not None else f"no {backend.name} kernel for {weight.dtype} activations"
        if replacement is None:
            if demanded:
                raise ConfigError("speculative_config.quantization", f"{quantization}: drafter layer {path} "
                                                  f"({weight.shape[0]}x{weight.shape[1]}) cannot be: {why}")
            kinds[f"dense ({why})"] += 1
            continue
        swaps.append((parent, name, replacement))
    if swaps and kinds and not demanded:
        # by default a drafter runs one way: mixed layers lost more than they saved on the 80-wide draft
        # model (6 of its 8 linears cannot be int8; its fused decoder stack then runs layer by layer:
        # draft step 9.27 -> 9.80 ms, docs/results/2026-12-05/drafter-costs)
        return Counter({f"dense (kept with the {sum(kinds.values())} that must be)": len(swaps), **kinds})
    for parent, name, replacement in swaps:
        setattr(parent, name, replacement)
    if swaps:
        kinds[f"int{bits}"] += len(swaps)
    return kinds


def _linears(module: nn.Module):
    for parent_path, parent in list(module.named_modules()):
        keep = getattr(parent, "keep_dense_linears", ())  # children whose .weight the parent reads itself
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and name not in keep:
                yield f"{parent_path}.{name}" if parent_path else name, parent, name, child


def _unquantizable(weight: torch.Tensor) -> str | None:
    if weight.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"weights are {weight.dtype}"
    if weight.shape[1] % _GROUP:
        return f"in_features {weight.shape[1]} not a multiple of {_GROUP}"
    return None


def describe(kinds: Counter) -> str:
    """``"6 int8"``, ``"5 int8, 1 dense (in_features 80 not a multiple of 32)"``."""
    return ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())) or "no linear layers"


__all__ = ["DRAFTER_QUANTIZATION_CHOICES", "describe", "quantize_drafter"]
