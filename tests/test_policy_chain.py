"""The policy chain: gates in one declared order, each with one signature (docs/policy.md)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from hyspec.errors import HyspecError
from hyspec.policy.chain import GATE_ORDER, Decision, PolicyChain, StepState
from hyspec.seam.step import NONE, StepPlan

DOCS = Path(__file__).resolve().parents[1] / "docs"


class Gate:
    def __init__(self, name: str, answer=None, seen: list | None = None):
        self.name = name
        self.answer = answer
        self.seen = seen if seen is not None else []

    def __call__(self, step: StepState):
        self.seen.append((self.name, step.method))
        return self.answer(step) if callable(self.answer) else self.answer


def state(**kw) -> StepState:
    defaults = dict(scheduler=None, decoding=[object()], batch=1, proposers={}, release=print, reload=print)
    return StepState(**{**defaults, **kw})


def test_the_gates_run_in_the_declared_order_until_one_decides():
    seen: list = []
    answers = {"method": Decision.choose("eagle"),
               "batch_size": lambda step: Decision.stop(StepPlan(step.method, 0, 0, step.batch, "budget_zero"))}
    chain = PolicyChain([Gate(name, answers.get(name), seen) for name in GATE_ORDER])
    plan = chain.plan(state())
    assert plan == StepPlan("eagle", 0, 0, 1, "budget_zero")
    # every gate up to the one that decided, each seeing the method chosen before it; none after it
    assert seen == [("memory_pressure", NONE), ("ttft_slo", NONE), ("method", NONE), ("nothing_to_draft", "eagle"),
                    ("released_method", "eagle"), ("batch_size", "eagle")]


def test_a_chain_in_another_order_or_with_a_gate_missing_is_refused():
    with pytest.raises(HyspecError, match="declared order"):
        PolicyChain([Gate(name) for name in reversed(GATE_ORDER)])
    with pytest.raises(HyspecError, match="declared order"):
        PolicyChain([Gate(name) for name in GATE_ORDER[1:]])


def test_a_chain_whose_last_gate_has_no_opinion_fails_loudly():
    with pytest.raises(HyspecError, match="no gate decided"):
        PolicyChain([Gate(name) for name in GATE_ORDER]).plan(state())


def test_the_docs_show_the_chain_in_its_order():
    text = (DOCS / "policy.md").read_text()
    rows = re.findall(r"^\| \d \| `([a-z_]+)` \|", text, flags=re.MULTILINE)
    assert tuple(rows) == GATE_ORDER


def test_plan_records_compare_without_their_start_time():
    # StepPlan.started (the step's wall clock, for what is learnt after it) is not part of a plan's identity
    assert StepPlan("ngram", 3, 3, 2, started=1.0) == StepPlan("ngram", 3, 3, 2, started=2.0)


def test_the_decoder_keeps_nothing_between_its_calls(tmp_path):
    # strategy.py's rule: what one call of plan/draft/accept/observe learns travels in the records, not on
    # the strategy (the plan carries its start time, Accepted the drafting time)
    from hyspec import LLM, SamplingParams
    from tests.model.tiny_checkpoint import make_checkpoint

    make_checkpoint(tmp_path, "llama_gqa")
    llm = LLM(str(tmp_path), dtype="float32", kv_cache_bytes=8 << 20, speculative_config={
        "method": "hybrid", "num_speculative_tokens": 4, "controller": {"profile_at_startup": False},
        "hybrid": {"policy": "bandit", "methods": ["ngram", "suffix"]}})
    decoder = llm.engine.spec
    before = {name: id(value) for name, value in vars(decoder).items()}
    llm.generate(["x = [1, 2, 3, 1, 2, 3, 1, 2,", "def add(a, b):"],
                 SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    assert decoder.dispatcher.snapshot().decisions  # it planned, drafted and learnt
    assert {name: id(value) for name, value in vars(decoder).items()} == before
