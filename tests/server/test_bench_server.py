"""hyspec bench-server (hyspec.cli.bench_server, hyspec.bench.server_bench): the parts without a server (rows,
table, goal, configurations, options), and a slow end-to-end smoke run on the tiny models."""
from __future__ import annotations

import json

import pytest
from hyspec.bench import server_bench as bench
from hyspec.cli.bench_server import parse_args
from hyspec.cli.main import main as hyspec_main
from hyspec.spec.config import SpeculativeConfig


def test_rows_speedups_goal_and_table():
    S = bench.Sample
    plain = bench.cell("plain", 4, [S(0, [1, 2, 3], ttft=0.010, tpot=0.002), S(1, [4, 5, 6], ttft=0.030, tpot=0.004)],
                       wall=1.0, cpu=0.25, before={}, after={"decisions": {}, "draft_tokens": 0.0})
    before = {"decisions": {"ngram": 5.0, "none": 1.0}, "draft_tokens": 10.0, "accepted_tokens": 4.0}
    after = {"decisions": {"ngram": 15.0, "none": 3.0}, "draft_tokens": 30.0, "accepted_tokens": 19.0,
             "decision_p50_us": 2.0, "decision_p99_us": 9.5}
    hybrid = bench.cell("hybrid", 4, [S(0, [1, 2, 3, 4, 5], ttft=0.01, tpot=0.001), S(1, [], error="HTTP 429: busy")],
                        wall=1.0, cpu=0.2, before=before, after=after)
    assert (plain["tokens"], plain["requests"], plain["errors"]) == (6, 2, 0)
    assert plain["ttft_p50_s"] == pytest.approx(0.020) and "decisions" not in plain
    assert (hybrid["requests"], hybrid["errors"], hybrid["first_error"]) == (1, 1, "HTTP 429: busy")
    assert hybrid["decisions"] == {"ngram": 10.0, "none": 2.0}  # this cell's, not the server's lifetime
    assert hybrid["acceptance_rate"] == pytest.approx(15 / 20)
    rows = [plain, hybrid]
    bench.speedups(rows)
    assert hybrid["speedup_vs_plain"] == pytest.approx(5 / 6)
    g = bench.goal(rows)
    assert g["ratios"] == {4: pytest.approx(5 / 6)} and g["met"] is False
    table = bench.format_table(rows).splitlines()
    assert table[0].split()[:3] == ["config", "clients", "tok/s"]
    assert table[3].split()[:4] == ["hybrid", "4", "5.0", "0.83"] and "9.5" in table[3]


def test_default_configurations_are_valid_speculative_configs(tmp_path):
    args = parse_args(["--tiny", "--configs", "plain,hybrid,ngram,draft_model"])
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps([{"method": "ngram"}]))
    configs = bench.default_configs(args, {"draft_model": str(tmp_path)}, str(rules))
    assert configs["plain"] is None
    for name in ("hybrid", "ngram", "draft_model"):
        assert SpeculativeConfig.from_dict(configs[name]).method == name
    assert [m["method"] for m in configs["hybrid"]["hybrid"]["methods"]] == ["ngram", "draft_model"]
    with pytest.raises(SystemExit, match="no drafter weights for 'eagle'"):
        bench.default_configs(parse_args(["--configs", "eagle"]), {}, None)
    given = parse_args(["--configs", "hybrid", "--speculative-config", '{"method": "ngram"}',
                        "--config", 'x={"method": "ngram", "num_speculative_tokens": 2}'])
    assert bench.default_configs(given, {}, None) == {"hybrid": {"method": "ngram"},
                                                      "x": {"method": "ngram", "num_speculative_tokens": 2}}


@pytest.mark.parametrize("argv, message", [
    (["--clients", "1,x"], "--clients: expected a comma list"),
    (["--clients", "0"], "every count must be >= 1"),
    (["--clients", "64", "--max-num-seqs", "32"], "requests would queue"),
    (["--duration", "0"], "must be positive"),
])
def test_bad_options_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_tiny_end_to_end(tmp_path):
    """Two real `hyspec serve` subprocesses (plain and hybrid) on the tiny models, one second per client count."""
    out = tmp_path / "result.json"
    rc = hyspec_main(["bench-server", "--tiny", "--configs", "plain,hybrid", "--clients", "1,2", "--duration", "1",
                      "--max-tokens", "8", "--num-prompts", "4", "--max-num-seqs", "4", "--log-dir", str(tmp_path),
                      "--json", str(out)])
    doc = json.loads(out.read_text())
    assert rc == 0, doc["failures"]
    assert [(r["config"], r["clients"]) for r in doc["rows"]] == [("plain", 1), ("plain", 2), ("hybrid", 1),
                                                                  ("hybrid", 2)]
    assert all(r["requests"] > 0 and r["errors"] == 0 for r in doc["rows"])
    hybrid = [r for r in doc["rows"] if r["config"] == "hybrid"]
    assert all(r["decision_p50_us"] is not None and r["decision_p99_us"] >= r["decision_p50_us"] for r in hybrid)
    assert sum(r["decisions"].get("draft_model", 0) for r in hybrid) > 0  # the tiny rules: draft_model at batch <= 4
    assert doc["identity_vs_plain"]["hybrid"]["differing"] == []
    assert doc["goal"]["ratios"].keys() == {"1", "2"}
