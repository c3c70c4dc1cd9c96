"""Temperature > 0 on every available backend: speculative samples follow the target's exact law.

20,000 sequences per draft shape (chain, tree): detects a 3.2-point shift
in any outcome's probability (hyspec.conformance.stats explains the numbers;
tests/test_verify_stats.py runs the 200,000-sample version on the reference).
"""
from __future__ import annotations

import pytest
import torch

from hyspec.conformance.stats import ToyModels, check_statistics, compare_with_exact, speculative_samples
from tests.conformance.conftest import BACKENDS, assert_passed


@pytest.mark.parametrize("backend", BACKENDS)
def test_speculative_sampling_matches_the_target_law(target, backend):
    assert_passed(check_statistics(target))


def test_the_check_catches_a_biased_sampler(targets):
    """Move 4% of the probability of y1's likeliest token onto the runner-up: the 20,000-sample check must fail."""
    models = ToyModels()
    exact = models.exact()
    samples = speculative_samples(models, [-1, 0, 1, 2], targets["cpu"])
    y1 = exact["y1"]
    common, runner_up = y1.topk(2).indices.tolist()
    gen = torch.Generator().manual_seed(5)
    moved = (samples[:, 0] == common) & (torch.rand(samples.shape[0], generator=gen) < 0.04 / float(y1[common]))
    biased = samples.clone()
    biased[moved, 0] = runner_up
    assert compare_with_exact(samples, exact)[0] <= 1.0
    assert compare_with_exact(biased, exact)[0] > 1.0
