"""The seam between the engine and speculation: the calls a strategy gets, in order, with typed records."""
from __future__ import annotations

import pytest
import torch

from hyspec import LLM, SamplingParams
from hyspec.errors import ConfigError
from hyspec.seam.step import RowKind, TargetRun
from hyspec.seam.target import TargetContext
from hyspec.seam.tree import DraftTree
from hyspec.spec.strategy import PLAIN, Accepted, Drafts, NoSpeculation, Speculation, StepPlan


class RecordingStrategy(Speculation):
    """Drafts the token plain decoding would emit next (read from a reference run) as a one-node chain, and
    records every call, so the test can check the order of the stages and what crossed the seam."""

    def __init__(self, reference: dict[str, list[int]], inner: NoSpeculation):
        self.reference, self.inner, self.calls = reference, inner, []

    def plan(self, scheduler):
        self.calls.append("plan")
        return StepPlan("oracle", 1, 1, max(1, len(scheduler.running)))

    def draft(self, plan, scheduled):
        self.calls.append("draft")
        trees = {}
        for seq in scheduled.decodes:
            ref = self.reference[seq.request_id]
            nxt = seq.num_output_tokens
            if nxt < len(ref) and (seq.params.max_tokens or 0) - nxt > 1:
                trees[seq.request_id] = DraftTree.chain(seq.last_token, [ref[nxt]])
        return Drafts(plan, trees)

    def abandon(self, drafts, cause):
        self.calls.append("abandon")
        return Drafts(drafts.plan)

    def accept(self, run: TargetRun, drafts: Drafts) -> Accepted:
        self.calls.append("accept")
        assert all(isinstance(row.kind, RowKind) for row in run.rows) and run.seconds >= 0
        tokens, kept = {}, {}
        for i in run.indices(RowKind.TREE):
            seq = run.rows[i].seq
            logits = run.result.feed_logits(i)  # [2, V]: after the root, after the draft
            tree = drafts.trees[seq.request_id]
            first = int(logits[0].argmax())
            if first == int(tree.tokens[1]):
                tokens[seq.request_id], kept[seq.request_id] = [first, int(logits[1].argmax())], [0, 1]
            else:
                tokens[seq.request_id], kept[seq.request_id] = [first], [0]
            seq.kv.truncate(seq.kv.num_tokens - tree.num_nodes + len(kept[seq.request_id]))
        return Accepted(tokens, kept)

    def observe(self, run, accepted):
        self.calls.append("observe")

    def admit(self, seq):
        self.calls.append(f"admit {seq.request_id}")

    def release(self, seq):
        self.calls.append(f"release {seq.request_id}")


@pytest.fixture(scope="module")
def llm(tiny_ckpt):
    return LLM(str(tiny_ckpt[0]), dtype="float32", kv_cache_bytes=8 << 20)


def test_a_plain_engine_holds_the_null_strategy(llm):
    assert isinstance(llm.engine.spec, NoSpeculation) and not llm.engine.spec.enabled
    assert llm.engine.spec.plan(llm.engine.scheduler) is PLAIN


def test_a_strategy_sees_the_five_stages_in_order_and_output_stays_plain(llm):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    plain = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    engine = llm.engine
    ids = [str(i) for i in range(100, 102)]
    strategy = RecordingStrategy(dict(zip(ids, plain)), NoSpeculation())
    engine.spec = strategy
    try:
        for rid, prompt in zip(ids, prompts):
            engine.add_request(prompt, params, request_id=rid)
        outputs: dict[str, list[int]] = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                outputs[out.request_id] = out.outputs[0].token_ids
    finally:
        engine.spec = NoSpeculation()
    assert [outputs[r] for r in ids] == plain
    steps = [c for c in strategy.calls if not c.startswith(("admit", "release"))]
    assert steps[:4] == ["plan", "draft", "accept", "observe"]  # the first step: prefills only
    assert "abandon" not in steps
    # every step is plan -> draft -> accept -> observe (a step that schedules nothing stops after draft)
    i = 0
    while i < len(steps):
        assert steps[i:i + 2] == ["plan", "draft"], steps[i:i + 4]
        i += 2
        if i < len(steps) and steps[i] == "accept":
            assert steps[i + 1] == "observe"
            i += 2
    assert strategy.calls.count("admit 100") == 1 and strategy.calls.count("release 100") == 1
    # the oracle's drafts were used: after the prefill step, two tokens a step (plain would take 12 steps)
    assert steps.count("accept") <= 8, steps.count("accept")
    engine.pool.assert_all_free()


def test_a_worker_context_without_the_target_names_the_method_that_needs_it():
    from types import SimpleNamespace

    context = TargetContext(backend=SimpleNamespace(ops=None, device=torch.device("cpu")), pool=None,
                            vocab_size=320, max_model_len=64, dtype=torch.float32)
    with pytest.raises(ConfigError, match="eagle3 needs the target model"):
        context.require_model("eagle3")
