"""The A/B helper: every engine runs every wave each round, in turn, and outputs are checked against the first."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from hyspec.bench.interleaved_ab import close_and_save, interleaved_rates, medians, ratio, rounded, waves_of


class FakeLLM:
    """Echoes each prompt's tokens (or a fixed change of them) and records the calls."""

    def __init__(self, log: list, name: str, change: bool = False):
        self.log, self.name, self.change = log, name, change
        self.engine = SimpleNamespace(spec=SimpleNamespace(forget_shared_history=lambda: log.append((name, "forget"))))

    def generate(self, prompts, params, use_tqdm=True):
        self.log.append((self.name, tuple(map(tuple, prompts))))
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[t + self.change for t in p])]) for p in prompts]


def test_rounds_interleave_engines_and_count_outputs_that_differ():
    log: list = []
    engines = {"plain": FakeLLM(log, "plain"), "same": FakeLLM(log, "same"), "off": FakeLLM(log, "off", change=True)}
    waves = [[[1, 2], [3]], [[4]]]
    seen = []
    rates, mismatches = interleaved_rates(engines, waves, None, rounds=2, before_pass=lambda n, _: seen.append(n))
    assert seen == ["plain", "same", "off"] * 2
    assert [entry[0] for entry in log if entry[1] != "forget"] == ["plain"] * 2 + ["same"] * 2 + ["off"] * 2 + \
        ["plain"] * 2 + ["same"] * 2 + ["off"] * 2  # each engine runs both waves before the next starts
    assert mismatches == 2 * 3  # three outputs of "off" differ from plain's, in each of two rounds
    assert all(len(v) == 2 and all(r > 0 for r in v) for v in rates.values())
    med = medians({"a": [1.0, 3.0, 2.0], "b": [4.0, 4.0, 4.0]})
    assert med == {"a": 2.0, "b": 4.0} and ratio(med, "a", "b") == 0.5


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="rounds >= 1"):
        interleaved_rates({"plain": FakeLLM([], "plain")}, [[[1]]], None, rounds=0)


def test_waves_rounding_and_saving(tmp_path):
    import json

    assert waves_of([[1], [2], [3]], 2) == [[[1], [2]], [[3]]]
    assert rounded({"a": [1.26, 2.04]}) == {"a": [1.3, 2.0]}
    closed = []
    engines = {"a": SimpleNamespace(close=lambda: closed.append("a"))}
    close_and_save(engines, {"x": 1}, str(tmp_path / "o.json"))
    assert closed == ["a"] and json.loads((tmp_path / "o.json").read_text()) == {"x": 1}
    close_and_save(engines, {"x": 1}, None)  # no path: only closes
    assert closed == ["a", "a"]
