"""Canary rollout: a stable, hash-chosen share of requests speculates."""
from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from hyspec.policy.canary import CONTROL, SPEC, Canary, request_share
from hyspec.errors import ConfigError

IDS = [f"cmpl-{i:06d}" for i in range(20_000)]


def test_the_spec_share_is_within_a_binomial_bound():
    fraction = 0.05
    canary = Canary(fraction)
    spec = sum(canary.arm(rid) == SPEC for rid in IDS)
    mean, sd = len(IDS) * fraction, math.sqrt(len(IDS) * fraction * (1 - fraction))
    # 4.5 sigma: a fair hash leaves it with probability < 1e-5
    assert abs(spec - mean) <= 4.5 * sd, (spec, mean, sd)


def test_shares_are_uniform_enough_across_deciles():
    shares = [request_share(rid) for rid in IDS]
    assert all(0.0 <= s < 1.0 for s in shares)
    counts = [0] * 10
    for s in shares:
        counts[int(s * 10)] += 1
    chi2 = sum((c - 2000) ** 2 / 2000 for c in counts)
    assert chi2 < 33.7  # chi-square, 9 degrees of freedom, p = 1e-4


def test_assignment_is_stable_across_processes_and_hash_seeds():
    sample = IDS[:200]
    here = "".join("s" if Canary(0.3).arm(rid) == SPEC else "c" for rid in sample)
    code = (
        "from hyspec.policy.canary import Canary, SPEC\n"
        f"ids = [f'cmpl-{{i:06d}}' for i in range(200)]\n"
        "print(''.join('s' if Canary(0.3).arm(r) == SPEC else 'c' for r in ids))\n"
    )
    for seed in ("1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == here
    assert 20 < here.count("s") < 100


def test_raising_the_fraction_only_adds_requests_to_spec():
    small = {rid for rid in IDS if Canary(0.05).arm(rid) == SPEC}
    large = {rid for rid in IDS if Canary(0.10).arm(rid) == SPEC}
    assert small < large


def test_edges_and_salt():
    assert all(Canary(1.0).arm(rid) == SPEC for rid in IDS[:500])
    assert all(Canary(0.0).arm(rid) == CONTROL for rid in IDS[:500])
    assert Canary(0.5).arm(42) == Canary(0.5).arm("42") == Canary(0.5).arm(b"42")
    plain = [Canary(0.5).arm(rid) for rid in IDS[:400]]
    salted = [Canary(0.5, salt="experiment-2").arm(rid) for rid in IDS[:400]]
    agree = sum(a == b for a, b in zip(plain, salted))
    assert 140 < agree < 260  # an independent split agrees about half the time


@pytest.mark.parametrize("fraction", [-0.01, 1.01, math.nan])
def test_bad_fraction(fraction):
    with pytest.raises(ConfigError, match="hybrid.speculative_fraction"):
        Canary(fraction)
