"""The distributions actually sampled from, and sampling from them.

Losslessness (docs/architecture.md §4) is stated about *processed* distributions: the
target's ``p`` and the drafter's ``q`` are both what ``process_logits`` makes
of the raw logits with the request's temperature, top-k, top-p and min-p.  A
drafter that samples from one distribution and reports another (the classic
"q taken before top-p" bug) breaks the guarantee, so drafters and the
verifier share this one function and one ``SamplingTensors``.

Randomness: every random number of a request comes from that request's own
``torch.Generator`` (``None`` = torch's default generator), one uniform per
sampling event, so a seeded request is reproducible whatever else is in the
batch, and tests can inject the uniforms.  Sampling is by inverse CDF
(``sample_from_uniforms``): one uniform in, one token out.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Sequence

import numpy as np
import torch

from hyspec.errors import RequestError

#: Probabilities below this (after renormalisation) count as no mass at all.
_TINY = 1e-30
_FP32_LOWEST = np.finfo(np.float32).min  # what guard_logits maps a non-finite fp32 logit to


def guard_logits(logits: torch.Tensor) -> torch.Tensor:  # [N, V] -> [N, V], same dtype
    """NaN and +/-inf become the dtype's most negative finite value (never 0).

    Returns ``logits`` itself when every entry is finite; never modifies it.

    A poisoned entry then has (almost) no probability instead of a normal
    share of it, and a row that is entirely non-finite becomes a constant row,
    i.e. uniform after softmax, so a sampled id is always in ``[0, V)``.
    """
    if not logits.is_floating_point():
        raise TypeError(f"logits must be a floating-point tensor, got {logits.dtype}")
    # The common case, cheaply: a sum is finite only if every entry is (a NaN or an infinity makes it NaN or
    # infinite), so one reduction clears the row; an overflowing sum of finite values only takes the full check.
    if bool(torch.isfinite(logits.sum())) or bool(torch.isfinite(logits).all()):
        return logits
    lowest = torch.finfo(logits.dtype).min
    return torch.nan_to_num(logits, nan=lowest, posinf=lowest, neginf=lowest)


def greedy(logits: torch.Tensor) -> torch.Tensor:  # [N, V] -> [N] int64
    """Argmax of the guarded logits; ties go to the lowest index (torch.argmax's rule).

    fp32 rows on the CPU go through numpy's argmax, which is vectorized where torch's is not: over a
    49,152-token vocabulary a row took 10.5 us against 57 us with the guard, 32 rows 111 against 1113 us
    (docs/results/2026-12-07/greedy-argmax), and every decoding step pays it.  Both return the first
    maximum.  A row whose maximum is not finite (a NaN, which both argmaxes return as the maximum, or +inf),
    or is the dtype's lowest value (where a -inf mapped to it by the guard could tie), takes the guarded
    path, so the ids are always the guarded argmax's."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 2 and logits.shape[1]:
        values = logits.detach().numpy()
        ids = values.argmax(axis=-1)
        top = values[np.arange(ids.shape[0]), ids]
        if np.isfinite(top).all() and (top > _FP32_LOWEST).all():
            return torch.from_numpy(ids.astype(np.int64, copy=False))
    return guard_logits(logits).argmax(dim=-1)


def process_logits(
    logits: torch.Tensor,  # [N, V] any float dtype
    temperature: torch.Tensor,  # [N] float, 0 = greedy
    top_k: torch.Tensor,  # [N] int, <= 0 or >= V = off
    top_p: torch.Tensor,  # [N] float in (0, 1], 1 = off
    min_p: torch.Tensor,  # [N] float in [0, 1], 0 = off
) -> torch.Tensor:  # [N, V] fp32, rows sum to 1
    """The distribution a request samples from, one row per logits row.

    Order: guard non-finite, temperature, top-k, top-p, min-p, softmax.  Rows
    with temperature 0 are the one-hot of ``greedy(logits)``.  Top-k keeps the
    k largest logits, top-p the smallest most-likely-first prefix whose mass
    reaches ``top_p``; both also keep every token tied with the last one kept,
    so the result does not depend on how a sort orders ties.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [N, V], got shape {tuple(logits.shape)}")
    n, vocab = logits.shape
    for name, t in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p), ("min_p", min_p)):
        if t.shape != (n,):
            raise ValueError(f"{name} must have shape ({n},), got {tuple(t.shape)}")
    device = logits.device
    x = guard_logits(logits).float()
    is_greedy = (temperature == 0).to(device)
    num_greedy = int(is_greedy.sum())
    if num_greedy == n:
        return torch.nn.functional.one_hot(x.argmax(dim=-1), vocab).float()

    # Shift by the row max before dividing: the max becomes exactly 0 (so some
    # entry is always finite and the softmax never sees an all -inf row), and
    # large logits cannot overflow to +inf at small temperatures.
    temp = torch.where(is_greedy, 1.0, temperature.to(device=device, dtype=torch.float32))
    x = (x - x.max(dim=-1, keepdim=True).values) / temp[:, None]

    k = top_k.to(device=device, dtype=torch.int64)
    k_on = (k > 0) & (k < vocab)
    p = top_p.to(device=device, dtype=torch.float32)
    p_on = p < 1.0
    if bool(k_on.any()):
        x = _apply_top_k(x, k, k_on)
    if bool(p_on.any()):
        x = _apply_top_p(x, p, p_on)

    mp = min_p.to(device=device, dtype=torch.float32)
    mp_on = mp > 0
    if bool(mp_on.any()):
        # The row max is 0, so prob / max_prob = exp(x): "prob < min_p * max_prob"
        # is "x < log(min_p)".  The max itself (x = 0) always survives.
        threshold = torch.where(mp_on, mp.clamp_min(_TINY).log(), -torch.inf)
        x = x.masked_fill(x < threshold[:, None], -torch.inf)

    probs = torch.softmax(x, dim=-1)
    if num_greedy:
        # Shifting and dividing by 1 kept every greedy row's argmax where it was.
        one_hot = torch.nn.functional.one_hot(x.argmax(dim=-1), vocab).float()
        probs = torch.where(is_greedy[:, None], one_hot, probs)
    return probs


def _apply_top_k(x: torch.Tensor, k: torch.Tensor, k_on: torch.Tensor) -> torch.Tensor:
    """Mask logits below each row's k-th largest value (ties with it stay)."""
    max_k = int(k[k_on].max())
    top = x.topk(max_k, dim=-1).values  # [N, max_k] descending
    kth = top.gather(1, (k.clamp(1, max_k) - 1)[:, None])
    kth = torch.where(k_on[:, None], kth, -torch.inf)
    return x.masked_fill(x < kth, -torch.inf)


#: First top-p window; each retry looks 8x further.  A full sort of a 150k
#: vocabulary costs tens of times more than a top-64, and a 0.9 nucleus after
#: temperature rarely holds more than a few hundred tokens.
_TOP_P_FIRST_WINDOW = 64


def _apply_top_p(x: torch.Tensor, p: torch.Tensor, p_on: torch.Tensor) -> torch.Tensor:
    """Mask logits outside the smallest most-likely-first set holding ``p`` of the mass.

    Applied as a logit cutoff (the value of the last token kept), so ties with
    it stay.  The prefix masses are read from a top-W window normalised by the
    whole row's mass; a row whose window does not reach ``p`` retries with a
    larger W, up to the full vocabulary.  The cutoff does not depend on W.
    """
    vocab = x.shape[1]
    every_row = bool(p_on.all())
    rows = p_on.nonzero().squeeze(1)
    xs = x if every_row else x[rows]  # [R, V], max 0 per row
    target = p[rows]
    log_z = torch.logsumexp(xs, dim=-1)  # normaliser over what top-k kept
    cutoff = torch.full_like(log_z, -torch.inf)
    pending = torch.arange(rows.numel(), device=x.device)
    width = _TOP_P_FIRST_WINDOW
    while pending.numel():
        w = min(width, vocab)
        values = xs[pending].topk(w, dim=-1).values  # [P, w] descending
        probs = (values - log_z[pending, None]).exp()
        mass_before = probs.cumsum(dim=-1) - probs  # exclusive prefix sums, non-decreasing
        want = target[pending, None]
        # Resolved when the window's last token is already past the nucleus.
        resolved = (mass_before[:, -1:] >= want).squeeze(1) | (w == vocab)
        num_kept = (mass_before < want).sum(dim=-1, keepdim=True).clamp(min=1)
        cut = values.gather(1, num_kept - 1).squeeze(1)
        cutoff[pending[resolved]] = cut[resolved]
        pending = pending[~resolved]
        width *= 8
    filtered = xs.masked_fill(xs < cutoff[:, None], -torch.inf)
    if every_row:
        return filtered
    out = x.clone()
    out[rows] = filtered
    return out


def draw_uniforms(
    generators: Sequence[torch.Generator | None],
    counts: Sequence[int],
    device: torch.device | str = "cpu",
) -> torch.Tensor:  # [N, max(counts)] float64 in [0, 1); padding entries are 0.5
    """Row ``r`` holds ``counts[r]`` uniforms drawn from ``generators[r]`` only.

    How many numbers a request draws depends only on its own ``counts[r]``, so a
    seeded request's stream does not depend on the batch around it.  Rows with
    ``None`` share torch's default CPU generator.
    """
    if len(generators) != len(counts):
        raise ValueError(f"{len(generators)} generators for {len(counts)} rows")
    width = max(counts, default=0)
    out = torch.full((len(counts), width), 0.5, dtype=torch.float64)
    default_rows = [r for r, g in enumerate(generators) if g is None and counts[r] > 0]
    if default_rows:
        draws = torch.rand(sum(counts[r] for r in default_rows), dtype=torch.float64)
        start = 0
        for r in default_rows:
            out[r, : counts[r]] = draws[start : start + counts[r]]
            start += counts[r]
    for r, g in enumerate(generators):
        if g is not None and counts[r] > 0:
            out[r, : counts[r]] = torch.rand(counts[r], generator=g, dtype=torch.float64, device=g.device).cpu()
    return out.to(device)


def sample_from_uniforms(
    probs: torch.Tensor,  # [N, V] non-negative, rows with positive mass
    uniforms: torch.Tensor,  # [N] in [0, 1)
) -> torch.Tensor:  # [N] int64
    """Inverse-CDF sampling: the first token whose cumulative mass exceeds ``u * total``.

    The CDF is accumulated in float64, so a 150k vocabulary loses no precision
    that matters.  A zero-probability token is never returned (its CDF step is
    empty); ids are clamped into ``[0, V)`` even for an all-zero row.
    """
    cdf = probs.double().cumsum(dim=-1)
    target = uniforms.to(device=probs.device, dtype=torch.float64) * cdf[:, -1]
    ids = torch.searchsorted(cdf, target[:, None], right=True).squeeze(1)
    return ids.clamp_(max=probs.shape[-1] - 1)


def sample(
    probs: torch.Tensor,  # [N, V] fp32, e.g. from process_logits
    generators: Sequence[torch.Generator | None] | None = None,
    uniforms: torch.Tensor | None = None,  # [N], injected instead of drawing
) -> torch.Tensor:  # [N] int64
    """One token per row, row ``r`` drawing one uniform from ``generators[r]`` only."""
    n = probs.shape[0]
    if uniforms is None:
        gens = [None] * n if generators is None else list(generators)
        uniforms = draw_uniforms(gens, [1] * n, probs.device)[:, 0] if n else probs.new_zeros(0)
    if uniforms.shape != (n,):
        raise ValueError(f"uniforms must have shape ({n},), got {tuple(uniforms.shape)}")
    return sample_from_uniforms(probs, uniforms)


#: SamplingTensors.from_params' shared objects, by (device, values); emptied when full
_FROM_PARAMS: dict[tuple, "SamplingTensors"] = {}
_FROM_PARAMS_MAX = 256


@dataclass
class SamplingTensors:
    """Per-row sampling parameters as tensors (rows = requests, or tree nodes after ``repeat``).

    Built once per step from the requests' parameters and reused by the drafters
    (for q) and the verifier (for p), so both are processed identically.
    """

    temperature: torch.Tensor  # [N] fp32, 0 = greedy
    top_k: torch.Tensor  # [N] int64, <= 0 = off
    top_p: torch.Tensor  # [N] fp32, 1 = off
    min_p: torch.Tensor  # [N] fp32, 0 = off

    def __post_init__(self) -> None:
        n = self.temperature.shape[0] if self.temperature.dim() == 1 else -1
        for f in fields(self):
            t = getattr(self, f.name)
            if t.dim() != 1 or t.shape[0] != n:
                raise ValueError(f"SamplingTensors.{f.name} must be 1-D with {n} rows, got {tuple(t.shape)}")
        _check_range("temperature", self.temperature, lambda t: torch.isfinite(t) & (t >= 0), ">= 0 and finite")
        _check_range("top_p", self.top_p, lambda t: (t > 0) & (t <= 1), "in (0, 1]")
        _check_range("min_p", self.min_p, lambda t: (t >= 0) & (t <= 1), "in [0, 1]")
        # Host copy: the engine and the verifier branch on it without a device sync.
        self.is_greedy_host: list[bool] = (self.temperature == 0).tolist()

    @classmethod
    def from_lists(
        cls,
        temperature: Sequence[float],
        top_k: Sequence[int | None] | None = None,
        top_p: Sequence[float | None] | None = None,
        min_p: Sequence[float | None] | None = None,
        device: torch.device | str = "cpu",
    ) -> "SamplingTensors":
        """Per-request values; ``None`` (or a missing list) means the option is off."""
        n = len(temperature)

        def column(values: Sequence[Any] | None, off: Any, dtype: torch.dtype, name: str) -> torch.Tensor:
            if values is None:
                values = [off] * n
            if len(values) != n:
                raise ValueError(f"{name} has {len(values)} entries for {n} requests")
            return torch.tensor([off if v is None else v for v in values], dtype=dtype, device=device)

        return cls(
            temperature=column(temperature, 1.0, torch.float32, "temperature"),
            top_k=column(top_k, 0, torch.int64, "top_k"),
            top_p=column(top_p, 1.0, torch.float32, "top_p"),
            min_p=column(min_p, 0.0, torch.float32, "min_p"),
        )

    @classmethod
    def from_params(cls, params: Sequence[Any], device: torch.device | str = "cpu") -> "SamplingTensors":
        """From objects with ``temperature`` and optional ``top_k``, ``top_p``, ``min_p`` attributes.

        The same values on the same device give the same (shared) object: a speculative step builds these
        twice (drafting, verification) for the same requests, step after step, and building and checking
        them took ~60 us a call.  Nothing writes into a SamplingTensors' columns (select / repeat / to make
        new ones), which is what makes sharing safe."""
        columns = ([p.temperature for p in params], [getattr(p, "top_k", None) for p in params],
                   [getattr(p, "top_p", None) for p in params], [getattr(p, "min_p", None) for p in params])
        try:
            key = (str(device), *map(tuple, columns))
            cached = _FROM_PARAMS.get(key)
        except TypeError:  # an unhashable value: build it (and let from_lists judge it)
            return cls.from_lists(*columns, device=device)
        if cached is None:
            cached = cls.from_lists(*columns, device=device)
            if len(_FROM_PARAMS) >= _FROM_PARAMS_MAX:
                _FROM_PARAMS.clear()
            _FROM_PARAMS[key] = cached
        return cached

    @property
    def num_rows(self) -> int:
        return int(self.temperature.shape[0])

    def select(self, rows: torch.Tensor | Sequence[int]) -> "SamplingTensors":
        """The rows ``rows`` (e.g. the stochastic requests of a batch)."""
        idx = torch.as_tensor(rows, dtype=torch.int64, device=self.temperature.device)
        return self._derived(*(getattr(self, f.name)[idx] for f in fields(self)))

    def repeat(self, counts: torch.Tensor | Sequence[int]) -> "SamplingTensors":
        """Row ``r`` repeated ``counts[r]`` times (per request -> per tree node)."""
        reps = torch.as_tensor(counts, dtype=torch.int64, device=self.temperature.device)
        return self._derived(*(getattr(self, f.name).repeat_interleave(reps) for f in fields(self)))

    def to(self, device: torch.device | str) -> "SamplingTensors":
        return self._derived(*(getattr(self, f.name).to(device) for f in fields(self)))

    @classmethod
    def _derived(cls, *columns: torch.Tensor) -> "SamplingTensors":
        """Rows of tensors already checked (select, repeat, to): built without checking them again, which
        cost a row-by-row drafter about a fifth of its drafting time."""
        out = cls.__new__(cls)
        for f, column in zip(fields(cls), columns):
            setattr(out, f.name, column)
        out.is_greedy_host = (out.temperature == 0).tolist()
        return out

    def process(self, logits: torch.Tensor) -> torch.Tensor:  # [N, V] -> [N, V] fp32
        """``process_logits`` with these parameters (one row of parameters per logits row)."""
        return process_logits(logits, self.temperature, self.top_k, self.top_p, self.min_p)


def _check_range(name: str, t: torch.Tensor, ok: Any, what: str) -> None:
    bad = ~ok(t)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise RequestError(f"{name} must be {what}; request row {row} has {t[row].item()}")
