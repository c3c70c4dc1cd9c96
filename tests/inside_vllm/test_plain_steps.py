"""Steps without drafts take vLLM's plain path in the runner that hosts hyspec's proposer (core/vllm/plain_steps.py):
only those steps, only on a runner whose code decides as vLLM 0.32's does, never for a model with recurrent state.
The real runner is exercised by tests/inside_vllm/test_vllm_serve_e2e.py (token identity against vLLM plain)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from hyspec.vllm.plain_steps import take_plain_path_without_drafts, why_not


class Runner:
    """The part of vLLM 0.32's model runner the wrapper reads and changes."""

    def __init__(self, *, recurrent: bool = False):
        self.speculative_config = SimpleNamespace(method="custom_class")
        self.vllm_config = SimpleNamespace(model_config=SimpleNamespace(is_hybrid=recurrent, has_inner_state=False))
        self.fail = False

    def _prepare_inputs(self, scheduler_output, num_scheduled_tokens):
        use_spec_decode = self.speculative_config is not None
        if self.fail:
            raise RuntimeError("prepare failed")
        return use_spec_decode


class OtherRunner(Runner):
    def _prepare_inputs(self, scheduler_output, num_scheduled_tokens):
        return self.speculative_config


def output(drafts: dict[str, list[int]]) -> SimpleNamespace:
    return SimpleNamespace(scheduled_spec_decode_tokens=drafts)


def test_only_steps_without_drafts_are_prepared_as_plain_and_the_config_is_restored():
    runner, counter = Runner(), {}
    config = runner.speculative_config
    assert take_plain_path_without_drafts(runner, counter)
    assert runner._prepare_inputs(output({"a": [1, 2]}), None) is True  # drafts: vLLM's speculative path
    assert runner._prepare_inputs(output({}), None) is False  # none: the plain path
    assert runner.speculative_config is config and counter == {"plain_path_steps": 1}
    runner.fail = True
    with pytest.raises(RuntimeError):
        runner._prepare_inputs(output({}), None)
    assert runner.speculative_config is config  # restored even when vLLM's code raises
    assert take_plain_path_without_drafts(runner, counter)  # wrapping twice wraps once
    runner.fail = False
    runner._prepare_inputs(output({}), None)
    assert counter == {"plain_path_steps": 3}
    assert "_prepare_inputs" not in vars(Runner())  # other runners (engines) are not touched


def test_left_off_where_it_was_not_checked():
    assert "recurrent state" in why_not(Runner(recurrent=True))
    assert "vLLM 0.32" in why_not(OtherRunner())
    assert "not vLLM's model runner" in why_not(object())
    runner = Runner(recurrent=True)
    assert not take_plain_path_without_drafts(runner, {}) and "_prepare_inputs" not in vars(runner)
