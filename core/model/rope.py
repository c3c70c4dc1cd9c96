"""RoPE frequency tables, including the scaling types checkpoints ask for.

The table is static (computed once for ``max_positions``), as serving engines
do.  For ``dynamic`` NTK scaling this equals the reference implementation for
positions up to ``max_position_embeddings`` (where dynamic scaling is inactive)
and uses the scaled base for the whole context beyond it; the reference
re-derives the base from the current length, which a paged cache cannot follow
without re-rotating cached keys.

``longrope`` (Phi-3's 128k variants, Phi-3.5) divides each frequency by a short or a long factor set.  Which
set is fixed once per model, from the context it will serve: long when ``RopeConfig.context_length`` (an
engine's max_model_len; the table length when unset) exceeds ``original_max_position_embeddings`` --
llama.cpp's rule (``n_ctx_per_seq > n_ctx_orig_yarn``, src/llama-model.cpp) and vLLM 0.32's
(``max_model_len > original_max_position_embeddings``, phi3_long_rope_scaled_rope.py).  transformers instead
switches per forward on the longest position in the batch (``dynamic_rope_update``), which makes a
sequence's logits depend on its neighbours and on the step, and leaves keys cached before the switch rotated
with the short set; the two agree whenever the whole sequence lies on one side of the original length.
"""
from __future__ import annotations

import math

import torch

from hyspec.errors import CheckpointError
from hyspec.model.config import ModelConfig, RopeConfig


def inverse_frequencies(rope: RopeConfig, head_dim: int, max_position_embeddings: int,
                        max_positions: int) -> tuple[torch.Tensor, float]:
    """``(inv_freq [head_dim // 2] fp32, attention_factor)`` for the config's RoPE type, each frequency
    divided by its factor where the checkpoint stores per-frequency factors (a GGUF's ``rope_freqs``)."""
    inv_freq, attention_factor = _scaled_inverse_frequencies(rope, head_dim, max_position_embeddings, max_positions)
    if rope.freq_factors is None:
        return inv_freq, attention_factor
    if len(rope.freq_factors) != head_dim // 2:
        raise CheckpointError(f"RoPE frequency factors (GGUF rope_freqs) have {len(rope.freq_factors)} entries; "
                              f"head_dim {head_dim} needs {head_dim // 2}")
    # llama.cpp's ggml_rope_ext: theta_i = position * base^(-2i/d) / freq_factors[i], before any scaling
    return inv_freq / torch.tensor(rope.freq_factors, dtype=torch.float32), attention_factor


def _scaled_inverse_frequencies(rope: RopeConfig, head_dim: int, max_position_embeddings: int,
                                max_positions: int) -> tuple[torch.Tensor, float]:
    dim = head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    inv_freq = 1.0 / (rope.theta ** exponents)
    if rope.rope_type == "default":
        return inv_freq, 1.0
    if rope.rope_type == "linear":
        return inv_freq / rope.factor, 1.0
    if rope.rope_type == "dynamic":
        seq_len = max(max_positions, max_position_embeddings)
        base = rope.theta * ((rope.factor * seq_len / max_position_embeddings) - (rope.factor - 1)) ** (dim / (dim - 2))
        return 1.0 / (base ** exponents), 1.0
    if rope.rope_type == "llama3":
        return _llama3(inv_freq, rope), 1.0
    if rope.rope_type == "yarn":
        return _yarn(rope, dim, max_position_embeddings)
    if rope.rope_type == "longrope":
        return _longrope(rope, exponents, max_positions)
    raise AssertionError(rope.rope_type)  # RopeConfig validates the type


def _llama3(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    old_ctx = rope.original_max_position_embeddings
    low_wavelen = old_ctx / rope.low_freq_factor
    high_wavelen = old_ctx / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_ctx / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def uses_long_factors(rope: RopeConfig, max_positions: int) -> bool:
    """longrope: whether the long factor set applies (to every position and sequence of this model)."""
    context = rope.context_length if rope.context_length is not None else max_positions
    return context > rope.original_max_position_embeddings


def _longrope(rope: RopeConfig, exponents: torch.Tensor, max_positions: int) -> tuple[torch.Tensor, float]:
    for name in ("short_factor", "long_factor"):  # both checked, whichever this context uses
        if len(getattr(rope, name)) != exponents.numel():
            raise CheckpointError(f"rope_scaling.{name} has {len(getattr(rope, name))} entries; head_dim "
                                  f"{2 * exponents.numel()} needs {exponents.numel()}")
    long = uses_long_factors(rope, max_positions)
    factors = torch.tensor(rope.long_factor if long else rope.short_factor, dtype=torch.float32)
    # transformers: inv_freq = 1 / (factors * base ** (2i / d)); llama.cpp divides theta by the same factors
    inv_freq = 1.0 / (factors * rope.theta ** exponents)
    mscale = rope.long_mscale if long else rope.short_mscale
    if mscale is not None:
        return inv_freq, float(mscale)
    if rope.attention_factor is not None:
        return inv_freq, float(rope.attention_factor)
    # the LongRoPE paper's default, in both regimes (transformers, vLLM and llama.cpp's converter alike)
    orig = rope.original_max_position_embeddings
    return inv_freq, 1.0 if rope.factor <= 1 else math.sqrt(1 + math.log(rope.factor) / math.log(orig))


def _yarn(rope: RopeConfig, dim: int, max_position_embeddings: int) -> tuple[torch.Tensor, float]:
    factor = rope.factor
    orig = rope.original_max_position_embeddings or max_position_embeddings

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = rope.attention_factor
    if attention_factor is None:
        if rope.mscale and rope.mscale_all_dim:
            attention_factor = mscale(factor, rope.mscale) / mscale(factor, rope.mscale_all_dim)
        else:
            attention_factor = mscale(factor)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(rope.theta))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = rope.theta ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    extrapolation_weight = 1 - ramp
    inv_freq = interpolation * (1 - extrapolation_weight) + extrapolation * extrapolation_weight
    return inv_freq, float(attention_factor)


def cos_sin_cache(config: ModelConfig, max_positions: int) -> torch.Tensor:
    """``[max_positions, head_dim]`` fp32: cos in the first half of the last dim, sin in the second."""
    inv_freq, attention_factor = inverse_frequencies(
        config.rope, config.head_dim, config.max_position_embeddings, max_positions)
    positions = torch.arange(max_positions, dtype=torch.float32)
    freqs = positions[:, None] * inv_freq[None, :]  # [P, D/2]
    return torch.cat([freqs.cos() * attention_factor, freqs.sin() * attention_factor], dim=-1)
