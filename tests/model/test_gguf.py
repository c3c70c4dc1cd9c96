"""GGUF loading: round trips through the gguf package's writer, the tokenizer, the engine, bad files."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hyspec.errors import CheckpointError
from hyspec.model.config import ModelConfig
from hyspec.model.gguf_checkpoint import GGUFCheckpoint, permute_rope_rows, unpermute_rope_rows
from hyspec.model.loader import load_model
from hyspec.model.tokenizer import Tokenizer
from tests.model.gguf_fixtures import QTYPES, make_source_checkpoint, write_gguf

pytest.importorskip("gguf")

ARCHS = ("llama", "qwen2", "qwen3")
IDS = torch.arange(3, 318, 5)[None]  # 64 positions over most of the tiny vocabulary
TEXTS = ["def f(x):\n    return x + 12345  # digits\n", "  leading spaces\tand tabs</s>",
         "<s>special tokens stay whole</s> ünïcödé ✓"]


def _logits(model, ids=IDS) -> torch.Tensor:
    return model.compute_logits(model.forward_dense(ids).hidden[0])


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(source dir, gguf path) for every (arch, qtype), written once for the module."""
    root = tmp_path_factory.mktemp("gguf")
    out = {}
    for arch in ARCHS:
        for qtype in QTYPES:
            src = root / f"{arch}-{qtype}"
            make_source_checkpoint(src, arch)
            out[arch, qtype] = (src, write_gguf(src, root / f"{arch}-{qtype}.gguf", qtype, arch))
    return out


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("qtype", QTYPES)
def test_round_trip_gives_the_source_checkpoints_logits(converted, arch, qtype):
    src, gguf_file = converted[arch, qtype]
    cfg_dir, cfg_gguf = ModelConfig.from_pretrained(src), ModelConfig.from_pretrained(gguf_file)
    for field in ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "head_dim", "tie_word_embeddings", "qkv_bias",
                  "max_position_embeddings", "rope", "qk_norm"):
        assert getattr(cfg_gguf, field) == getattr(cfg_dir, field), field
    assert cfg_gguf.rms_norm_eps == pytest.approx(cfg_dir.rms_norm_eps)
    ref = _logits(load_model(src, dtype="float32"))
    got = _logits(load_model(gguf_file, dtype="float32"))
    # The same fp32 values in the same modules: the logits match to the bit.
    assert torch.equal(got, ref), f"max |diff| {(got - ref).abs().max().item()}"


def test_transformers_reads_our_test_file_the_same_way(converted):
    """An independent reader (transformers, gguf_file=) agrees: the test writer's q/k order is llama.cpp's."""
    transformers = pytest.importorskip("transformers")
    src, gguf_file = converted["llama", "F32"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name,
                                                           dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(IDS).logits[0]
    got = _logits(load_model(gguf_file, dtype="float32"))
    assert (got - ref).abs().max().item() < 1e-4


def test_rope_row_permutation_is_inverted_exactly():
    w = torch.randn(4 * 16, 24)
    assert torch.equal(unpermute_rope_rows(permute_rope_rows(w, 4), 4), w)
    assert not torch.equal(permute_rope_rows(w, 4), w)
    with pytest.raises(CheckpointError, match="RoPE heads"):
        unpermute_rope_rows(torch.randn(30, 8), 4)


def test_quantized_blocks_stay_available(converted):
    _, gguf_file = converted["llama", "Q4_1"]
    ckpt = GGUFCheckpoint(gguf_file)
    q = ckpt.quantized("model.layers.0.mlp.down_proj.weight")
    assert q.qtype == "Q4_1" and q.shape == (64, 128) and q.data.dtype == np.uint8
    assert q.data.shape == (64, 128 // 32 * 20)  # 20 bytes per 32-weight Q4_1 block
    assert ckpt.tensor_types() == {"Q4_1": 16, "F32": 5}  # embedding, lm_head, 7 per layer; norms


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tokenizer_from_gguf_equals_the_source_tokenizer(converted, arch):
    src, gguf_file = converted[arch, "Q8_0"]
    a, b = Tokenizer(src), Tokenizer(gguf_file)
    for text in TEXTS:
        assert b.encode(text) == a.encode(text), text
        ids = a.encode(text)
        assert b.decode(ids) == a.decode(ids)
    assert (b.bos_token_id, b.eos_token_id, b.vocab_size) == (a.bos_token_id, a.eos_token_id, a.vocab_size)
    msgs = [{"role": "user", "content": "hi"}]
    assert b.apply_chat_template(msgs) == a.apply_chat_template(msgs)


def test_engine_on_gguf_generates_what_it_does_on_the_directory(converted):
    from hyspec import LLM, SamplingParams

    src, gguf_file = converted["llama", "Q4_0"]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    a = LLM(str(src), dtype="float32", kv_cache_bytes=4 << 20).generate(["def f(x):"], params)
    b = LLM(str(gguf_file), dtype="float32", kv_cache_bytes=4 << 20,
            speculative_config={"method": "ngram", "num_speculative_tokens": 3}).generate(["def f(x):"], params)
    assert b[0].outputs[0].token_ids == a[0].outputs[0].token_ids


def test_auto_dtype_is_bf16_for_quantized_files_and_fp32_for_f32_ones(converted):
    assert ModelConfig.from_pretrained(converted["llama", "Q4_1"][1]).torch_dtype == "bfloat16"
    assert ModelConfig.from_pretrained(converted["llama", "F32"][1]).torch_dtype == "float32"


# -- bad input -------------------------------------------------------------------------------------------


def test_unsupported_architecture_is_named_with_the_supported_list(tmp_path, converted):
    src, _ = converted["llama", "F32"]
    bad = write_gguf(src, tmp_path / "falcon.gguf", "F32", "llama", architecture_name="falcon")
    with pytest.raises(CheckpointError, match=r"architecture 'falcon' is not supported; supported: llama, qwen2, qwen3"):
        ModelConfig.from_pretrained(bad)


@pytest.mark.parametrize("keep", [0.5, 0.02])
def test_truncated_file_is_a_clear_error(tmp_path, converted, keep):
    _, gguf_file = converted["llama", "Q8_0"]
    data = gguf_file.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(CheckpointError, match="cut.gguf is not a readable GGUF file"):
        load_model(cut, dtype="float32")


def test_not_a_gguf_and_missing_file(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"this is not a gguf file at all" * 10)
    with pytest.raises(CheckpointError, match="junk.gguf is not a readable GGUF file"):
        ModelConfig.from_pretrained(junk)
    with pytest.raises(CheckpointError, match="does not exist"):
        ModelConfig.from_pretrained(tmp_path / "nope.gguf")


def test_quantization_gguf_cannot_dequantize_is_named(tmp_path, converted):
    import gguf

    src, _ = converted["llama", "F32"]
    path = tmp_path / "q8_1.gguf"
    write_gguf(src, path, "F32", "llama")
    # Rewrite one matrix as Q8_1 (a type gguf has no dequantizer for) by writing a fresh file around it.
    reader = gguf.GGUFReader(str(path))
    w = gguf.GGUFWriter(str(tmp_path / "mixed.gguf"), "llama")
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = field.contents()
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, value, vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(name, value, vtype)
    for t in reader.tensors:
        if t.name == "blk.0.ffn_up.weight":
            rows, cols = int(t.shape[1]), int(t.shape[0])
            block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_1][1]
            w.add_tensor(t.name, np.zeros((rows, cols // 32 * block_bytes), np.uint8),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_1)
        else:
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match="blk.0.ffn_up.weight is stored as Q8_1, which the installed gguf "
                                              "package cannot dequantize"):
        load_model(tmp_path / "mixed.gguf", dtype="float32")


def test_gguf_without_tokenizer_metadata_asks_for_one(tmp_path, converted):
    from hyspec import LLM, SamplingParams

    src, _ = converted["llama", "F32"]
    bare = write_gguf(src, tmp_path / "bare.gguf", "F32", "llama", tokenizer=False)
    with pytest.raises(CheckpointError, match=r"carries no tokenizer metadata.*--tokenizer DIR"):
        LLM(str(bare), kv_cache_bytes=4 << 20)
    llm = LLM(str(bare), tokenizer=str(src), kv_cache_bytes=4 << 20)
    out = llm.generate(["def f(x):"], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4


def test_cli_tokenizer_flag(tmp_path, converted, capsys):
    from hyspec.cli.main import main

    src, _ = converted["llama", "F32"]
    bare = write_gguf(src, tmp_path / "bare.gguf", "F32", "llama", tokenizer=False)
    assert main(["generate", "--model", str(bare), "--prompt", "x", "--max-tokens", "2"]) == 2
    assert "--tokenizer DIR" in capsys.readouterr().err
    assert main(["generate", "--model", str(bare), "--tokenizer", str(src), "--prompt", "x", "--max-tokens", "2",
                 "--kv-cache-bytes", str(4 << 20)]) == 0


def test_tokenizer_saved_from_gguf_is_a_plain_directory(tmp_path, converted):
    src, gguf_file = converted["qwen2", "F16"]
    Tokenizer(gguf_file).save(tmp_path / "tok")
    a, b = Tokenizer(src), Tokenizer(tmp_path / "tok")
    assert all(b.encode(t) == a.encode(t) for t in TEXTS)
    assert (b.eos_token_id, b.chat_template) == (a.eos_token_id, a.chat_template)


def test_train_draft_for_a_gguf_target_runs_losslessly(tmp_path, converted):
    """train-draft takes a GGUF target: the draft_model it writes carries the GGUF's tokenizer and is lossless."""
    from hyspec import LLM, SamplingParams
    from hyspec.cli.main import main

    _, gguf_file = converted["llama", "Q8_0"]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.py").write_text("def add(a, b):\n    return a + b\n" * 40)
    out = tmp_path / "draft"
    assert main(["train-draft", "--method", "draft_model", "--target", str(gguf_file), "--data", str(corpus),
                 "--out", str(out), "--steps", "3", "--batch-size", "2", "--seq-len", "32", "--hidden-size", "64",
                 "--layers", "1", "--no-progress"]) == 0
    assert (out / "tokenizer.json").is_file()
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    plain = LLM(str(gguf_file), dtype="float32", kv_cache_bytes=4 << 20).generate(["def add("], params)
    spec = LLM(str(gguf_file), dtype="float32", kv_cache_bytes=4 << 20,
               speculative_config={"method": "draft_model", "model": str(out), "num_speculative_tokens": 3,
                                   "controller": {"enabled": False, "profile_at_startup": False}})
    assert spec.generate(["def add("], params)[0].outputs[0].token_ids == plain[0].outputs[0].token_ids
