"""`hyspec bench --workload`: the request streams (agentic repeats after their originals, mixed interleaved),
their errors, and one end-to-end run in which suffix drafts from the repeats but never from an earlier pass."""
from __future__ import annotations

import json

import pytest

from hyspec.bench.settings import BenchSettings
from hyspec.bench.workloads import AGENTIC_RUNS, agentic_instructions, workload_requests
from hyspec.errors import ConfigError, HyspecError
from tests.bench.conftest import bench_args


def render(messages):
    return "<|user|>\n" + messages[0]["content"] + "\n<|assistant|>\n"


def test_agentic_requests_embed_stdlib_code_and_come_again_after_their_originals():
    texts = [t for t, rendered in workload_requests("agentic", render, 10)]
    assert len(texts) == 10 and texts[:5] == texts[5:]  # five distinct, then the same five again
    assert AGENTIC_RUNS == 2
    assert len(set(texts[:5])) == 5
    assert all("```python\ndef " in t and "Reply with the complete updated function" in t for t in texts)
    first = agentic_instructions(3)
    assert "Rename the function" in first[0] and "Rename the parameter" in first[1] and "docstring" in first[2]


def test_mixed_interleaves_code_chat_and_agentic():
    requests = workload_requests("mixed", render, 9)
    assert [rendered for _, rendered in requests] == [False, True, True] * 3
    texts = [t for t, _ in requests]
    assert "```python" in texts[2] and "```python" not in texts[1]
    assert texts[0].lstrip().startswith(("from", "def", "import"))  # a HumanEval prompt


def test_mixed_holds_agentic_re_runs():
    """Its agentic third re-runs its own requests, after them, as the agentic workload does."""
    texts = [t for t, _ in workload_requests("mixed", render, 18)]
    agentic = texts[2::3]
    assert len(agentic) == 6 and agentic[:3] == agentic[3:] and len(set(agentic)) == 3
    assert len(set(texts[0::3])) == 6 and len(set(texts[1::3])) == 6  # code and chat do not repeat


def test_unknown_workloads_and_conflicting_options_are_named(tmp_path):
    with pytest.raises(HyspecError, match="unknown workload 'agents'"):
        workload_requests("agents", render, 4)
    with pytest.raises(ConfigError, match="--workload"):
        BenchSettings(workload="agents")
    with pytest.raises(ConfigError, match="--workload or --prompts, not both"):
        BenchSettings(workload="chat", prompts_file=tmp_path / "p.jsonl")


def test_agentic_end_to_end_suffix_identical_and_passes_start_cold(tiny, tmp_path, monkeypatch):
    """Two timed passes: each starts with an empty response cache (forgotten untimed before the pass), so
    suffix's cache drafts come from the workload's own repeats, not from the previous pass."""
    from hyspec.cli.main import main
    from hyspec.drafters.suffix.proposer import SuffixProposer

    sizes = []
    original = SuffixProposer.forget_shared_history

    def recording(self):
        original(self)
        sizes.append(len(self.cache))

    monkeypatch.setattr(SuffixProposer, "forget_shared_history", recording)
    path = tmp_path / "r.json"
    args = bench_args(tiny, "--methods", "ngram,suffix", "--peers", "none", "--json", str(path), max_tokens=8)
    i = args.index("--prompts")
    del args[i:i + 2]
    args += ["--workload", "agentic"]
    args[args.index("--num-prompts") + 1] = "4"
    assert main(args) == 0
    doc = json.loads(path.read_text())
    assert doc["dataset"]["name"] == "agentic" and doc["dataset"]["num_prompts"] == 4
    by_method = {r["method"]: r for r in doc["results"]}
    assert by_method["suffix"]["status"] == "ok" and by_method["suffix"]["identity"]["token_identical"] is True
    assert sizes == [0, 0]  # two passes, each started with nothing cached


def test_continuous_batching_refills_slots_and_stays_identical(tiny, tmp_path, monkeypatch):
    """--batching continuous end to end: never more than the batch size in flight, kept full; the outputs
    are identical to plain decoding and the setting is in the JSON."""
    from hyspec.cli.main import main
    from hyspec.engine.engine import LLMEngine

    in_flight: list[int] = []
    joined: list[int] = []  # engine steps taken when each request was added
    steps = [0]
    add, step = LLMEngine.add_request, LLMEngine.step

    def adding(self, *args, **kwargs):
        joined.append(steps[0])
        return add(self, *args, **kwargs)

    def stepping(self):
        steps[0] += 1
        in_flight.append(len(self.scheduler.running) + len(self.scheduler.waiting))
        return step(self)

    monkeypatch.setattr(LLMEngine, "add_request", adding)
    monkeypatch.setattr(LLMEngine, "step", stepping)
    path = tmp_path / "r.json"
    args = bench_args(tiny, "--methods", "ngram", "--peers", "none", "--json", str(path), "--batching",
                      "continuous", max_tokens=6)
    args[args.index("--num-prompts") + 1] = "6"
    args[args.index("--batch-sizes") + 1] = "2"
    assert main(args) == 0
    doc = json.loads(path.read_text())
    assert doc["settings"]["batching"] == "continuous"
    assert all(r["status"] == "ok" for r in doc["results"])
    assert {r["method"]: r["identity"]["token_identical"] for r in doc["results"] if r["identity"]} == {"ngram": True}
    assert max(in_flight) == 2 and in_flight.count(2) > 3
    assert len(joined) > 6  # warm-up, then every request of each pass


def test_continuous_generation_replaces_each_finished_request_at_once():
    """Requests that take 3, 1, 1, 1, 1 steps at concurrency 2: each joins the step after a slot frees, alone,
    never in a wave; outputs come back in request order."""
    from types import SimpleNamespace

    from hyspec.bench.hyspec_runs import _generate_continuous
    from hyspec.bench.measure import Workload

    lengths = [3, 1, 1, 1, 1]

    class Engine:
        def __init__(self):
            self.left, self.joined, self.steps = {}, [], 0

        def add_request(self, prompt, params, request_id):
            self.left[request_id] = (lengths[len(self.joined)], prompt)
            self.joined.append(self.steps)
            return SimpleNamespace(request_id=request_id)

        def step(self):
            self.steps += 1
            assert len(self.left) <= 2
            outs = []
            for rid, (n, prompt) in list(self.left.items()):
                self.left[rid] = (n - 1, prompt)
                if n == 1:
                    del self.left[rid]
                    outs.append(SimpleNamespace(request_id=rid, finished=True, prompt=prompt))
            return outs

        def has_unfinished_requests(self):
            return bool(self.left)

    engine = Engine()
    workload = Workload(tuple((i,) for i in range(6)), 2, 0.0, 4, 0)
    outs = _generate_continuous(SimpleNamespace(engine=engine), workload, range(5), 4)
    assert [o.prompt for o in outs] == [[0], [1], [2], [3], [4]]
    assert engine.joined == [0, 0, 1, 2, 3]  # two at first, then one each time one finished


def test_batching_must_be_waves_or_continuous():
    with pytest.raises(ConfigError, match="--batching"):
        BenchSettings(batching="static")
