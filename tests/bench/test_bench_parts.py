"""The benchmark's parts without a model: prompts, options, statistics, identity verdicts, goals, rendering."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from hyspec.bench.identity import check_identity
from hyspec.bench.machine import PeakMemory, decode_weight_bytes, measure_copy_bandwidth
from hyspec.bench.measure import Workload, acceptance_from_totals
from hyspec.bench.prompts import build_prompt_set, humaneval_prompts, read_prompt_file
from hyspec.bench.result import derive, goals
from hyspec.bench.settings import VLLM_PEERS, BenchSettings, parse_json_object, parse_list, with_preset
from hyspec.bench.stats import Spread, cost_per_million_tokens
from hyspec.cli.main import main
from hyspec.errors import ConfigError, HyspecError


# -- prompts -----------------------------------------------------------------------------------------

def test_humaneval_prompts_come_from_the_installed_package():
    prompts = humaneval_prompts()
    assert len(prompts) == 164
    assert prompts[0].startswith("from typing import List") and "def has_close_elements" in prompts[0]


def test_prompt_file_jsonl_and_text(tmp_path):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "def f():"}\n\n{"prompt": "x = 1\\n", "id": 3}\n')
    assert read_prompt_file(jsonl) == ["def f():", "x = 1\n"]
    text = tmp_path / "p.txt"
    text.write_text("def f():\\n    return\nimport os\n")
    assert read_prompt_file(text) == ["def f():\n    return", "import os"]


@pytest.mark.parametrize("content, message", [
    ("", "holds no prompt"),
    ("\n   \n", "holds no prompt"),
    ('{"prompt": "ok"}\n{"prompt": "broken\n', "line 2: malformed JSON"),
    ('{"prompt": "ok"}\n{"text": "no prompt field"}\n', "line 2: expected a JSON object with a string 'prompt'"),
    ('{"prompt": 7}\n', "line 1: expected a JSON object"),
    ('["a list"]\n', "line 1: expected a JSON object"),
    ('{"prompt": "   "}\n', "line 1: the prompt is empty"),
])
def test_bad_prompt_files_name_the_line(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(HyspecError, match=message) as info:
        read_prompt_file(path)
    assert str(path) in str(info.value)


def test_missing_prompt_file(tmp_path):
    with pytest.raises(HyspecError, match="cannot read"):
        read_prompt_file(tmp_path / "nope.jsonl")


def test_cli_reports_a_bad_prompt_file_before_loading_anything(tmp_path, capsys):
    path = tmp_path / "empty.txt"
    path.write_text("")
    assert main(["bench", "--model", str(tmp_path), "--prompts", str(path), "--no-progress"]) == 2
    assert "holds no prompt" in capsys.readouterr().err


def test_prompt_set_cycles_and_left_truncates():
    encode = lambda text: [ord(c) for c in text]  # noqa: E731
    ps = build_prompt_set(["abcdef", "xy"], "t", encode, num_prompts=3, max_prompt_tokens=4)
    assert ps.token_ids == ((99, 100, 101, 102), (120, 121), (99, 100, 101, 102))  # the end is kept
    assert ps.truncated == 2 and ps.summary()["prompt_tokens"] == {"mean": 10 / 3, "min": 2, "max": 4}
    with pytest.raises(HyspecError, match="no room for a prompt"):
        build_prompt_set(["a"], "t", encode, 1, 0)


# -- options -----------------------------------------------------------------------------------------

def test_settings_validation_names_the_option():
    with pytest.raises(ConfigError, match="--methods: unknown method 'medusa'"):
        BenchSettings(methods=("ngram", "medusa"))
    with pytest.raises(ConfigError, match="--batch-sizes"):
        BenchSettings(batch_sizes=(1, 0))
    with pytest.raises(ConfigError, match="--temperatures"):
        BenchSettings(temperatures=(-0.5,))
    with pytest.raises(ConfigError, match="--peers"):
        BenchSettings(peers=("sglang",))  # vllm is a peer now (vllm_peer.py)
    with pytest.raises(ConfigError, match="--drafter"):
        BenchSettings(drafters={"ngram": "x"})
    with pytest.raises(ConfigError, match="must not set 'method'"):
        BenchSettings(speculative_config_extra={"method": "ngram"})
    with pytest.raises(ConfigError, match="--batch-sizes: 'x' is not an integer"):
        parse_list("1,x", int, "--batch-sizes")
    with pytest.raises(ConfigError, match="invalid JSON"):
        parse_json_object("{nope", "--speculative-config-extra")
    # plain decoding always runs, and methods come in table order
    assert BenchSettings(methods=("hybrid", "ngram")).methods == ("none", "ngram", "hybrid")


def test_quick_preset_fills_only_what_was_not_given():
    s = with_preset(BenchSettings(quick=True, max_tokens=7), {"max_tokens"})
    assert s.max_tokens == 7 and s.batch_sizes == (1,) and s.num_prompts == 4
    assert s.methods == ("none", "ngram", "draft_model", "eagle3", "hybrid")
    full = with_preset(BenchSettings(), set())
    assert full.batch_sizes == (1, 4, 16, 32) and full.methods is None


def test_demo_preset_is_plain_beside_suffix_interleaved_without_peers(capsys):
    import argparse

    from hyspec.cli import bench as bench_cli

    parser = argparse.ArgumentParser()
    bench_cli.add_arguments(parser)
    s = bench_cli._settings(parser.parse_args(["--demo"]))
    assert s.demo and s.methods == ("none", "suffix") and s.peers == () and s.interleave
    assert (s.num_prompts, s.max_tokens, s.batch_sizes, s.temperatures, s.repeats) == (3, 48, (1,), (0.0,), 3)
    assert main(["bench", "--demo", "--quick", "--no-progress"]) == 2
    assert "give --demo or --quick, not both" in capsys.readouterr().err


def test_bad_options_exit_2(capsys):
    assert main(["bench", "--methods", "ngram,bogus", "--no-progress"]) == 2
    assert "unknown method 'bogus'" in capsys.readouterr().err
    assert main(["bench", "--speculative-config-extra", "[1, 2]", "--no-progress"]) == 2
    assert "expected a JSON object" in capsys.readouterr().err


def test_cli_module_does_not_import_torch():
    code = "import sys, hyspec.cli.bench, hyspec.cli.main; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# -- measurements ------------------------------------------------------------------------------------

def test_spread_median_quartiles_and_cost():
    s = Spread.of([4.0, 1.0, 3.0, 2.0])
    assert (s.median, s.min, s.max, s.q1, s.q3) == (2.5, 1.0, 4.0, 1.75, 3.25)
    assert s.runs == (4.0, 1.0, 3.0, 2.0)
    assert cost_per_million_tokens(1000.0, 3.6) == pytest.approx(1.0)  # 3.6 M tokens per hour for 3.6
    assert cost_per_million_tokens(1000.0, None) is None


def test_workload_fills_whole_waves_and_seeds_sampling():
    w = Workload.build([(1,), (2,), (3,)], batch_size=2, temperature=0.5, max_tokens=4, seed=10)
    assert w.prompts == ((1,), (2,), (3,), (1,)) and [list(r) for r in w.waves] == [[0, 1], [2, 3]]
    assert w.request_seed(3) == 13
    assert Workload.build([(1,)], 1, 0.0, 4, 10).request_seed(0) is None


def test_acceptance_deltas_follow_vllm_conventions():
    before = {"drafts": 2, "draft_tokens": 8, "accepted_tokens": 3, "accepted_per_position": [2, 1]}
    after = {"drafts": 12, "draft_tokens": 48, "accepted_tokens": 23, "accepted_per_position": [10, 7, 4, 2]}
    acc = acceptance_from_totals(before, after)
    assert acc["drafts"] == 10 and acc["accepted_tokens"] == 20
    assert acc["mean_acceptance_length"] == pytest.approx(3.0) and acc["acceptance_rate"] == pytest.approx(0.5)
    assert acc["per_position"] == pytest.approx([0.8, 0.6, 0.4, 0.2])


def test_decode_weight_bytes_skips_an_untied_input_embedding():
    class Tiny(torch.nn.Module):
        def __init__(self, tied: bool):
            super().__init__()
            self.embed_tokens = torch.nn.Embedding(10, 4)
            self.proj = torch.nn.Linear(4, 4, bias=False)
            self.lm_head = torch.nn.Linear(4, 10, bias=False)
            if tied:
                self.lm_head.weight = self.embed_tokens.weight

    assert decode_weight_bytes(Tiny(tied=False)) == (16 + 40) * 4
    assert decode_weight_bytes(Tiny(tied=True)) == (16 + 40) * 4  # the shared matrix once, read by the lm_head


def test_a_cpu_packed_tied_model_counts_its_shared_head_once():
    """hyspec's CausalLM ties without an lm_head module, and the CPU backend packs its linear layers
    (the lm_head's packed copy lives in the op table's cache, outside the model): parameters and decode
    bytes must count the tied matrix once."""
    from hyspec.backends.registry import get_backend
    from hyspec.bench.machine import unique_parameter_count
    from hyspec.model.config import ModelConfig
    from hyspec.model.llama import CausalLM

    cfg = ModelConfig.from_dict({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64,
                                 "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                                 "num_attention_heads": 2, "num_key_value_heads": 1, "tie_word_embeddings": True,
                                 "max_position_embeddings": 32})
    model = CausalLM(cfg).to(torch.bfloat16)
    unique = sum(p.numel() for p in model.parameters())
    before = decode_weight_bytes(model)
    packed = get_backend("cpu").optimize_model(model)
    assert unique_parameter_count(packed) == unique
    assert decode_weight_bytes(packed) == before == unique * 2


def test_copy_bandwidth_and_peak_memory():
    bw = measure_copy_bandwidth(1 << 20, torch.device("cpu"), repeats=2)
    assert bw["bytes_per_s"] > 0 and bw["bytes"] == 1 << 20
    peak = PeakMemory(torch.device("cpu"))
    peak.reset()
    block = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MiB, touched
    high = peak.read()
    del block
    assert high.rss_bytes >= 64 << 20
    if peak.resettable:  # the high-water mark falls back once the block is gone and the counter is reset
        peak.reset()
        assert peak.read().rss_bytes < high.rss_bytes


# -- identity ----------------------------------------------------------------------------------------

def test_identity_tells_near_ties_from_mismatches():
    logits = torch.zeros(8)
    logits[3], logits[5] = 10.0, 10.0 - 1e-6  # 3 and 5 tie within fp32 rounding; everything else is far below
    reference = lambda prefix: logits  # noqa: E731
    prompts, expected = [[1], [1], [1]], [[3, 3], [3, 3], [3, 3]]
    v = check_identity(prompts, expected, [[3, 3], [3, 5], [3, 3]], reference, torch.float32)
    assert v.status == "near_tie" and v.near_ties == 1 and v.ok and "position 1" in v.details[0]
    v = check_identity(prompts, expected, [[3, 3], [3, 3], [3, 6]], reference, torch.float32)
    assert v.status == "mismatch" and v.mismatches == 1 and not v.ok
    assert v.to_dict()["token_identical"] is False
    v = check_identity(prompts, expected, [[3, 3], [3, 3], [3]], reference, torch.float32)  # stopped early
    assert v.status == "mismatch"
    assert check_identity(prompts, expected, expected, reference, torch.float32).status == "identical"


# -- derived figures and goals -----------------------------------------------------------------------

def _row(engine, method, bs, rate):
    return {"engine": engine, "method": method, "label": f"{engine} {method}", "batch_size": bs,
            "temperature": 0.0, "status": "ok", "tokens_per_s": {"median": rate}}


def test_speedups_bandwidth_and_goals():
    rows = [_row("hyspec", "none", 1, 100.0), _row("hyspec", "ngram", 1, 300.0), _row("hyspec", "hybrid", 1, 98.0),
            _row("hyspec", "none", 4, 200.0), _row("hyspec", "hybrid", 4, 180.0),
            _row("transformers", "hf_generate", 1, 50.0), _row("transformers", "hf_prompt_lookup", 1, 120.0),
            {"engine": "transformers", "method": "hf_assisted", "batch_size": 1, "temperature": 0.0,
             "status": "skipped", "tokens_per_s": None}]
    derive(rows, decode_weight_bytes=1000, copy_bytes_per_s=150_000.0, price_per_hour=None)
    ngram = rows[1]
    assert ngram["speedup_vs_plain"] == pytest.approx(3.0)
    assert ngram["speedup_vs_peers"] == {"hf_generate": pytest.approx(6.0), "hf_prompt_lookup": pytest.approx(2.5),
                                         "hf_assisted": None, "llamacpp": None, "llamacpp_prompt_lookup": None,
                                         **{peer: None for peer in VLLM_PEERS}}  # not measured in this run
    assert rows[0]["bandwidth_limit_tokens_per_s"] == pytest.approx(150.0)
    assert rows[3]["bandwidth_limit_tokens_per_s"] == pytest.approx(600.0)
    assert rows[0]["bandwidth_ratio"] == pytest.approx(100 / 150)
    g = {x["target"]: x for x in goals(rows)}
    assert g[1.3]["measured"] == pytest.approx(2.0) and g[1.3]["met"] is True
    assert g[2.5]["measured"] == pytest.approx(3.0) and g[2.5]["met"] is True and "ngram" in g[2.5]["detail"]
    assert g[2.0]["measured"] == pytest.approx(2.5) and g[2.0]["met"] is True
    assert g[2.0]["detail"] == ("best: hyspec ngram 300.0 tok/s vs best assisted: transformers hf_prompt_lookup "
                                "120.0 tok/s")
    # hybrid: 0.98x at bs 1, 0.90x at bs 4 -> the minimum; 16 and 32 not measured -> not met, incomplete
    assert g[0.95]["measured"] == pytest.approx(0.9) and g[0.95]["met"] is None
    assert "not measured at batch size 16, 32" in g[0.95]["detail"]
    assert g[0.5]["measured"] == pytest.approx(100 / 150) and g[0.5]["met"] is True


def test_readme_table_rejects_files_that_are_not_results(tmp_path, capsys):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"kind": "something-else"}))
    assert main(["bench", "--readme-table", str(path)]) == 2
    assert "not a hyspec bench result" in capsys.readouterr().err
    path.write_text(json.dumps({"kind": "hyspec-bench", "schema_version": 99}))
    assert main(["bench", "--readme-table", str(path)]) == 2
    assert "schema version 99" in capsys.readouterr().err


def test_the_teacher_forcing_judge_is_built_only_when_an_output_differs_from_plain_decoding():
    from hyspec.bench.identity import IDENTICAL, MISMATCH, IdentityVerdict, LazyJudge

    built = []

    def build():
        built.append(1)
        return lambda prompts, expected, actual: IdentityVerdict(MISMATCH, sequences=len(actual), mismatches=1)

    judge = LazyJudge(build)
    verdict = judge([[1, 2]], [[3, 4, 5]], [[3, 4, 5]])
    assert verdict.status == IDENTICAL and verdict.sequences == 1 and not built
    assert judge([[1, 2]], [[3, 4, 5]], [[3, 4, 6]]).status == MISMATCH and built == [1]
    judge([[1, 2]], [[3, 4, 5]], [[3, 9, 9]])
    assert built == [1]  # built once, kept
