"""``hyspec train-draft`` end to end: draft_model output that the runtime uses losslessly, and bad input."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hyspec import LLM, SamplingParams
from hyspec.cli.main import main
from hyspec.train.workspace import is_complete

PROMPTS = ["def add(a, b):", "import os\n", "class Foo:\n    def", "x = [", "return self",
           "for i in range(", "if x is None:\n    ", "@property\ndef name(self):"]
GREEDY = SamplingParams(temperature=0, max_tokens=40)
NO_CONTROLLER = {"enabled": False, "profile_at_startup": False}


def cli(target: Path, data: Path | str, out: Path, *extra: str) -> list[str]:
    return ["train-draft", "--method", "draft_model", "--target", str(target), "--data", str(data), "--out", str(out),
            "--steps", "30", "--batch-size", "4", "--seq-len", "32", "--lr", "3e-3", "--hidden-size", "64",
            "--layers", "1", "--no-progress", *extra]


@pytest.fixture(scope="module")
def drafter(target_dir, corpus_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "draft"
    assert main(cli(target_dir, corpus_dir, out)) == 0
    return out


def test_output_is_a_plain_hf_checkpoint(drafter, target_dir):
    import transformers

    from hyspec.model.loader import load_model

    assert sorted(p.name for p in drafter.iterdir()) == [
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "training_log.json"]
    assert (drafter / "tokenizer.json").read_bytes() == (target_dir / "tokenizer.json").read_bytes()
    ours = load_model(drafter)
    assert ours.config.num_hidden_layers == 1 and ours.config.hidden_size == 64
    theirs = transformers.LlamaForCausalLM.from_pretrained(drafter, dtype=torch.float32).eval()
    ids = torch.randint(0, 320, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours.compute_logits(ours.forward_dense(ids).hidden), theirs(ids).logits)


@pytest.mark.parametrize("batch", [1, 8])
def test_trained_drafter_is_lossless_in_the_runtime(drafter, target_dir, batch):
    plain = LLM(str(target_dir), dtype="float32", kv_cache_bytes=8 << 20)
    spec = LLM(str(target_dir), dtype="float32", kv_cache_bytes=8 << 20,
               speculative_config={"method": "draft_model", "model": str(drafter), "num_speculative_tokens": 3,
                                   "controller": NO_CONTROLLER})
    for i in range(0, len(PROMPTS), batch):
        ref = [o.outputs[0].token_ids for o in plain.generate(PROMPTS[i:i + batch], GREEDY)]
        got = [o.outputs[0].token_ids for o in spec.generate(PROMPTS[i:i + batch], GREEDY)]
        assert got == ref
    totals = spec.engine.spec.metrics.snapshot()["totals"]
    assert totals["draft_tokens"] > 0
    spec.engine.pool.assert_all_free()


def test_self_generated_windows_are_the_targets_greedy_continuations(target_dir):
    from hyspec.model.tokenizer import Tokenizer
    from hyspec.train.selfgen import generate_windows, make_generator

    tok = Tokenizer(target_dir)
    prompts = [tok.encode(p) for p in PROMPTS[:3]]
    w = generate_windows(make_generator(target_dir, 24, "float32"), prompts, seq_len=24, temperature=0.0, seed=0,
                         pad_id=tok.eos_token_id)
    plain = LLM(str(target_dir), dtype="float32", kv_cache_bytes=8 << 20)
    for row, p in enumerate(prompts):
        cont = plain.generate([{"prompt_token_ids": p}], SamplingParams(temperature=0, max_tokens=24 - len(p)))
        expect = p + list(cont[0].outputs[0].token_ids)
        assert w.ids[row, : len(expect)].tolist() == expect
        counted = w.loss_mask[row].nonzero().flatten().tolist()
        assert counted == list(range(len(p) - 1, len(expect) - 1))  # only predictions of generated tokens


def failing(capsys, argv: list[str], message: str, out: Path) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert not is_complete(out)


def test_bad_input_exits_2_with_a_clear_message(target_dir, corpus_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    empty = tmp_path / "empty"
    empty.mkdir()
    failing(capsys, cli(target_dir, empty, out), "holds no", out)
    (empty / "blank.txt").write_text("")
    failing(capsys, cli(target_dir, empty, out), "has no tokens", out)
    failing(capsys, cli(tmp_path / "nowhere", corpus_dir, out), "does not exist", out)
    failing(capsys, cli(empty, corpus_dir, out), "config.json not found", out)
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (no_weights / name).write_bytes((target_dir / name).read_bytes())
    failing(capsys, cli(no_weights, corpus_dir, out), "no *.safetensors", out)
    failing(capsys, cli(target_dir, corpus_dir, out, "--option", "depth=3"), "draft_model.depth", out)
    assert not out.exists() and not (tmp_path / "out.partial").exists()  # nothing left behind at all

    with pytest.raises(SystemExit) as exc:
        main(["train-draft", "--method", "medusa", "--data", "x", "--out", str(out)])
    assert exc.value.code == 2 and "invalid choice" in capsys.readouterr().err

    from hyspec.spec import registry
    from hyspec.train import base

    monkeypatch.delitem(base.RECIPES, "mtp", raising=False)
    monkeypatch.setitem(registry.METHODS, "mtp", dataclasses.replace(registry.METHODS["mtp"],
                                                                     recipe="hyspec.train.no_such_recipe"))
    argv = cli(target_dir, corpus_dir, out)
    argv[argv.index("draft_model")] = "mtp"
    failing(capsys, argv, "recipe module hyspec.train.no_such_recipe is missing", out)


def test_finished_output_is_kept_unless_overwrite(drafter, target_dir, corpus_dir, capsys):
    before = (drafter / "model.safetensors").read_bytes()
    failing_argv = cli(target_dir, corpus_dir, drafter, "--steps", "2")
    assert main(failing_argv) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (drafter / "model.safetensors").read_bytes() == before
    assert main(failing_argv + ["--overwrite", "--seed", "1"]) == 0
    assert is_complete(drafter) and (drafter / "model.safetensors").read_bytes() != before


def test_cli_process_exit_code_and_no_traceback(tmp_path):
    r = subprocess.run([sys.executable, "-m", "hyspec.cli.main", "train-draft", "--method", "draft_model",
                        "--target", str(tmp_path), "--data", "stdlib", "--out", str(tmp_path / "o")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "config.json not found" in r.stderr and "Traceback" not in r.stderr
