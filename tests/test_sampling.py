"""hyspec.ops.sampling: processed distributions, guards, inverse-CDF sampling, per-request generators."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hyspec.errors import RequestError
from hyspec.ops import OP_NAMES, reference_ops
from hyspec.ops.sampling import (
    SamplingTensors,
    draw_uniforms,
    greedy,
    guard_logits,
    process_logits,
    sample,
    sample_from_uniforms,
)


def _params(n, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    return (
        torch.full((n,), temperature),
        torch.full((n,), top_k, dtype=torch.int64),
        torch.full((n,), top_p),
        torch.full((n,), min_p),
    )


def reference_process(row, temperature, top_k, top_p, min_p):
    """Scalar brute force of process_logits for one row; returns (probs, decision margin)."""
    v = len(row)
    if temperature == 0:
        best = max(range(v), key=lambda i: (row[i], -i))
        return [float(i == best) for i in range(v)], math.inf
    top = max(row)
    x = [(r - top) / temperature for r in row]
    order = sorted(range(v), key=lambda i: (-x[i], i))
    keep = set(range(v))
    if 0 < top_k < v:
        kth = x[order[top_k - 1]]
        keep = {i for i in keep if x[i] >= kth}

    def softmax(kept):
        z = sum(math.exp(x[i]) for i in kept)
        return {i: math.exp(x[i]) / z for i in kept}

    margin = math.inf
    if top_p < 1:
        probs, cum, kept = softmax(keep), 0.0, set()
        for i in (i for i in order if i in keep):
            margin = min(margin, abs(cum - top_p))
            if kept and cum >= top_p:
                break
            kept.add(i)
            cum += probs[i]
        cutoff = min(x[i] for i in kept)
        keep = {i for i in keep if x[i] >= cutoff}  # ties with the last kept token stay
    if min_p > 0:
        probs = softmax(keep)
        pmax = max(probs.values())
        margin = min(margin, *(abs(p - min_p * pmax) for p in probs.values()))
        keep = {i for i in keep if probs[i] >= min_p * pmax}
    probs = softmax(keep)
    return [probs.get(i, 0.0) for i in range(v)], margin


# Logits on a half-integer grid and power-of-two temperatures: the shift and the
# division are exact in fp32 and float64 alike, so ties are the same for both.
row_strategy = st.lists(st.integers(-12, 12).map(lambda i: i / 2), min_size=2, max_size=12)


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(row_strategy, min_size=1, max_size=4).filter(lambda rs: len({len(r) for r in rs}) == 1),
    data=st.data(),
)
def test_process_logits_matches_brute_force(rows, data):
    v = len(rows[0])
    params = [
        (
            data.draw(st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0])),
            data.draw(st.integers(-1, v + 1)),
            data.draw(st.sampled_from([1.0, 0.95, 0.8, 0.5, 0.3, 0.1])),
            data.draw(st.sampled_from([0.0, 0.0, 0.1, 0.3, 0.7])),
        )
        for _ in rows
    ]
    expected = []
    for row, (t, k, p, m) in zip(rows, params):
        probs, margin = reference_process(row, t, k, p, m)
        assume(margin > 1e-4)  # fp32 vs float64 may legitimately decide a boundary differently
        expected.append(probs)
    cols = list(zip(*params))
    got = process_logits(
        torch.tensor(rows),
        torch.tensor(cols[0]),
        torch.tensor(cols[1]),
        torch.tensor(cols[2]),
        torch.tensor(cols[3]),
    )
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float32), atol=2e-6, rtol=1e-5)


def test_temperature_zero_is_one_hot_of_first_maximum():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    probs = process_logits(logits, *_params(2, temperature=0.0))
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    assert greedy(logits).tolist() == [1, 0] == logits.argmax(-1).tolist()


def test_each_row_uses_its_own_parameters():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 4))
    probs = process_logits(
        logits,
        torch.tensor([1.0, 1.0, 1.0, 0.0]),
        torch.tensor([0, 2, 0, 0]),
        torch.tensor([1.0, 1.0, 0.75, 1.0]),
        torch.tensor([0.0, 0.0, 0.0, 0.0]),
    )
    torch.testing.assert_close(probs[0], torch.tensor([0.5, 0.3, 0.15, 0.05]))
    torch.testing.assert_close(probs[1], torch.tensor([0.625, 0.375, 0.0, 0.0]))
    torch.testing.assert_close(probs[2], torch.tensor([0.625, 0.375, 0.0, 0.0]))  # 0.5 < 0.75 <= 0.8
    tied = process_logits(torch.tensor([[1.0, 0.0, 0.0, -5.0]]), *_params(1, top_p=0.6))
    assert (tied[0] > 0).tolist() == [True, True, True, False]  # both tokens tied at the cut stay
    assert probs[3].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_top_k_keeps_ties_and_min_p_is_relative_to_the_max():
    logits = torch.tensor([[2.0, 1.0, 1.0, 0.0]])
    probs = process_logits(logits, *_params(1, top_k=2))
    assert (probs[0] > 0).tolist() == [True, True, True, False]
    probs = process_logits(torch.log(torch.tensor([[0.5, 0.3, 0.2]])), *_params(1, min_p=0.5))
    torch.testing.assert_close(probs[0], torch.tensor([0.625, 0.375, 0.0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_non_finite_logits_are_guarded(dtype):
    nan, inf = float("nan"), float("inf")
    logits = torch.tensor(
        [[1.0, nan, 2.0, 0.0], [inf, 0.0, 1.0, -inf], [nan, nan, nan, nan], [-inf, -inf, inf, nan]], dtype=dtype
    )
    guarded = guard_logits(logits)
    assert torch.isfinite(guarded).all() and guarded[0, 1] == torch.finfo(dtype).min
    for temperature in (0.0, 0.05, 1.0):
        probs = process_logits(logits, *_params(4, temperature=temperature, top_p=0.9, top_k=3))
        assert torch.isfinite(probs).all()
        torch.testing.assert_close(probs.sum(-1), torch.ones(4))
        assert probs[0, 1] == 0 and probs[1, 0] == 0  # NaN and +inf never gain mass
        ids = sample(probs, [torch.Generator().manual_seed(s) for s in range(4)])
        assert ((ids >= 0) & (ids < 4)).all()
    uniform = process_logits(logits, *_params(4))[2]
    torch.testing.assert_close(uniform, torch.full((4,), 0.25))
    assert greedy(logits).tolist()[:2] == [2, 2]


def test_greedy_is_the_guarded_argmax_on_ties_and_non_finite_entries():
    """fp32 rows on the CPU take numpy's argmax (sampling.greedy): on rows full of ties, NaN, +-inf and the
    lowest finite value, and on strided, transposed and half-precision inputs, the ids equal the guarded
    torch argmax's, first maximum included."""
    gen = torch.Generator().manual_seed(0)
    lowest = torch.finfo(torch.float32).min
    specials = (float("nan"), float("inf"), float("-inf"), lowest, -0.0)
    for trial in range(1500):
        n, vocab = int(torch.randint(0, 5, (1,), generator=gen)), int(torch.randint(1, 40, (1,), generator=gen))
        logits = torch.randint(-3, 3, (n, vocab), generator=gen).float()  # small integers: many ties
        pick = torch.rand(n, vocab, generator=gen)
        for i, value in enumerate(specials):
            logits[(pick > 0.9 - 0.04 * i) & (pick <= 0.94 - 0.04 * i)] = value
        if n and trial % 7 == 0:
            logits[0] = float("-inf")
        if n and trial % 11 == 0:
            logits[-1] = lowest
        ids = greedy(logits)
        assert ids.dtype == torch.int64 and torch.equal(ids, guard_logits(logits).argmax(dim=-1)), logits
    wide = torch.randn(4, 100, generator=gen)
    for logits in (wide[:, ::2], wide.T, wide.bfloat16()):
        assert torch.equal(greedy(logits), guard_logits(logits).argmax(dim=-1))
    with torch.inference_mode():
        assert torch.equal(greedy(wide), wide.argmax(dim=-1))


def test_tiny_temperature_and_huge_logits_do_not_overflow():
    logits = torch.tensor([[3e38, 2e38, -3e38], [1.0, 1.0 + 1e-3, 0.0]])
    probs = process_logits(logits, *_params(2, temperature=1e-6))
    assert torch.isfinite(probs).all()
    assert probs.argmax(-1).tolist() == [0, 1]


@settings(max_examples=100, deadline=None)
@given(weights=st.lists(st.integers(0, 20), min_size=1, max_size=10).filter(lambda w: sum(w) > 0))
def test_inverse_cdf_on_a_uniform_grid_reproduces_the_distribution(weights):
    """Grid midpoints u = (g + 1/2)/G hit token j exactly ~G * p_j times (error <= 1 per token)."""
    probs = torch.tensor(weights, dtype=torch.float32)
    probs = probs / probs.sum()
    grid = 4096
    u = (torch.arange(grid, dtype=torch.float64) + 0.5) / grid
    ids = sample_from_uniforms(probs.expand(grid, -1), u)
    counts = torch.bincount(ids, minlength=len(weights)).double()
    assert (counts[probs == 0] == 0).all()  # a zero-probability token is never drawn
    assert (counts / grid - probs.double()).abs().max() <= 1.0 / grid + 1e-7


def test_inverse_cdf_edges():
    probs = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    ids = sample_from_uniforms(probs, torch.tensor([1.0 - 2**-53, 0.0], dtype=torch.float64))
    assert ids.tolist() == [2, 3]  # an all-zero row (never produced by process_logits) still gives an id in range


def test_each_row_draws_from_its_own_generator_whatever_the_batch():
    vocab = 32
    probs = torch.softmax(torch.randn(1, vocab, generator=torch.Generator().manual_seed(3)), -1)

    def draws(batch_extra: int, steps: int = 20) -> list[int]:
        gens = [torch.Generator().manual_seed(1234)] + [
            torch.Generator().manual_seed(99 + i) if i % 2 else None for i in range(batch_extra)
        ]
        others = torch.softmax(torch.randn(batch_extra, vocab), -1)
        out = []
        for _ in range(steps):
            out.append(int(sample(torch.cat([probs, others]), gens)[0]))
        return out

    alone = draws(0)
    assert alone == draws(5) == draws(17)
    assert len(set(alone)) > 1  # it really samples


def test_draw_uniforms_counts_and_streams():
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    u = draw_uniforms([g1, None, torch.Generator().manual_seed(8)], [3, 2, 0])
    assert u.shape == (3, 3) and u.dtype == torch.float64
    assert u[0].tolist() == torch.rand(3, generator=g2, dtype=torch.float64).tolist()
    assert u[2].tolist() == [0.5, 0.5, 0.5]  # padding, no draws
    assert ((u >= 0) & (u < 1)).all()


def test_sampling_tensors_validation_and_helpers():
    st_ = SamplingTensors.from_params(
        [SimpleNamespace(temperature=0.0), SimpleNamespace(temperature=0.7, top_k=5, top_p=0.9, min_p=None)]
    )
    assert st_.is_greedy_host == [True, False]
    assert st_.top_k.tolist() == [0, 5] and st_.min_p.tolist() == [0.0, 0.0]
    rep = st_.repeat([2, 3])
    assert rep.temperature.tolist() == pytest.approx([0, 0, 0.7, 0.7, 0.7])
    assert st_.select([1]).top_k.tolist() == [5]
    for kwargs, name in (
        (dict(temperature=[-0.1]), "temperature"),
        (dict(temperature=[float("nan")]), "temperature"),
        (dict(temperature=[1.0], top_p=[0.0]), "top_p"),
        (dict(temperature=[1.0], top_p=[1.5]), "top_p"),
        (dict(temperature=[1.0], min_p=[2.0]), "min_p"),
    ):
        with pytest.raises(RequestError, match=name):
            SamplingTensors.from_lists(**kwargs)
    with pytest.raises(ValueError, match="top_k has 2 entries"):
        SamplingTensors.from_lists([1.0], top_k=[1, 2])


def test_process_logits_rejects_bad_shapes():
    with pytest.raises(ValueError, match="logits must be"):
        process_logits(torch.zeros(4), *_params(1))
    with pytest.raises(ValueError, match="top_p must have shape"):
        process_logits(torch.zeros(2, 4), torch.ones(2), torch.zeros(2, dtype=torch.int64), torch.ones(3), torch.zeros(2))
    with pytest.raises(TypeError, match="floating-point"):
        guard_logits(torch.zeros(2, 4, dtype=torch.int64))


def test_sampling_ops_are_in_the_op_table():
    assert {"sample", "rejection_sample"} <= set(OP_NAMES)
    ops = reference_ops()
    assert ops.sample is sample
    marker = object()
    custom = ops.with_overrides("test", rejection_sample=lambda *a: marker)
    assert custom.rejection_sample() is marker and custom.native_ops() == ["rejection_sample"]


@pytest.mark.parametrize("window", [1, 3])
def test_top_p_window_retries_give_the_full_sort_result(monkeypatch, window):
    """Rows whose nucleus outgrows the first top-W window retry with 8x W: same cutoff."""
    import hyspec.ops.sampling as sampling

    g = torch.Generator().manual_seed(0)
    logits = torch.cat([torch.randn(6, 300, generator=g) * 0.05, torch.randn(6, 300, generator=g) * 3])
    n = logits.shape[0]
    params = (torch.full((n,), 1.5), torch.zeros(n, dtype=torch.int64), torch.full((n,), 0.8), torch.zeros(n))
    full_window = process_logits(logits, *params)  # vocab 300 < 8 * 64: one window at most two
    monkeypatch.setattr(sampling, "_TOP_P_FIRST_WINDOW", window)
    torch.testing.assert_close(process_logits(logits, *params), full_window, atol=0, rtol=0)
    for row in (0, 7):
        expected, margin = reference_process(logits[row].tolist(), 1.5, 0, 0.8, 0.0)
        assert margin > 1e-6
        assert ((full_window[row] > 0) == (torch.tensor(expected) > 0)).all()


def test_from_params_shares_one_object_per_values_and_still_refuses_bad_values():
    a = [SimpleNamespace(temperature=0.7, top_k=5, top_p=0.9, min_p=None)] * 3
    b = [SimpleNamespace(temperature=0.7, top_k=5, top_p=0.9, min_p=None) for _ in range(3)]
    first, second = SamplingTensors.from_params(a), SamplingTensors.from_params(b)
    assert first is second  # equal values, other objects: the same built tensors
    assert first.temperature.tolist() == pytest.approx([0.7] * 3) and first.top_k.tolist() == [5] * 3
    assert first.min_p.tolist() == [0.0] * 3 and first.is_greedy_host == [False] * 3
    other = SamplingTensors.from_params([SimpleNamespace(temperature=0.0, top_k=None, top_p=None, min_p=None)])
    assert other is not first and other.is_greedy_host == [True]
    for _ in range(2):  # a refusal is never cached: every call says so
        with pytest.raises(ValueError, match="top_p"):
            SamplingTensors.from_params([SimpleNamespace(temperature=1.0, top_k=None, top_p=1.5, min_p=None)])
