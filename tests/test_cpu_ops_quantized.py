"""Weight-only int4 / int8 on the CPU: GGUF codes repacked exactly, kernels against a dequantized reference,
rows independent of the batch, the loader's per-tensor choice, and its errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hyspec.cpu_ops.quantized_linear import (KERNEL_DTYPE, Int4Linear, Int8Linear, int4_kernel_available,
                                             int8_kernel_available, per_row_int8)
from hyspec.errors import ConfigError
from hyspec.model.quant import GroupQuantized, concat_rows, dequantize, from_gguf, quantize

gguf = pytest.importorskip("gguf")
needs_int4 = pytest.mark.skipif(not int4_kernel_available(), reason="torch's CPU int4 kernel does not run here")
needs_int8 = pytest.mark.skipif(not int8_kernel_available(), reason="torch's CPU int8 kernel does not run here")


def _gguf_blocks(values: np.ndarray, qtype: str) -> tuple[np.ndarray, np.ndarray]:
    from gguf import quants

    t = getattr(gguf.GGMLQuantizationType, qtype)
    blocks = quants.quantize(values, t)
    return blocks, quants.dequantize(blocks, t).astype(np.float32)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
def test_gguf_blocks_become_codes_scales_and_zeros_exactly(qtype):
    rng = np.random.default_rng(0)
    values = (rng.standard_normal((48, 96)) * 0.05).astype(np.float32)
    values[3, :32] = 0.0  # an all-zero block (d = 0)
    blocks, ref = _gguf_blocks(values, qtype)
    w = from_gguf(qtype, blocks, values.shape, "t")
    assert w.bits == (8 if qtype == "Q8_0" else 4) and w.group_size == 32 and w.source == qtype
    # the same values as the gguf package's (llama.cpp's) dequantizer, to the bit
    assert torch.equal(dequantize(w), torch.from_numpy(ref))


def test_types_without_groups_are_not_taken():
    assert from_gguf("F16", np.zeros((2, 32), np.float16), (2, 32)) is None
    assert from_gguf("Q6_K", np.zeros((2, 210), np.uint8), (2, 256)) is None


def test_quantize_error_is_at_most_half_a_step():
    torch.manual_seed(0)
    dense = torch.randn(64, 128)
    for bits in (4, 8):
        w = quantize(dense, bits)
        err = (dequantize(w) - dense).abs().view(64, -1, w.group_size)
        assert (err <= w.scale[..., None] * 0.5 * (1 + 1e-5) + 1e-7).all(), bits


def test_concat_rows_refuses_unlike_parts():
    a, b = quantize(torch.randn(32, 64), 4), quantize(torch.randn(32, 64), 8)
    assert concat_rows([a, b]) is None
    both = concat_rows([a, quantize(torch.randn(16, 64), 4)])
    assert both.shape == (48, 64) and torch.equal(dequantize(both)[:32], dequantize(a))


def _kernel_reference(w: GroupQuantized, x: torch.Tensor) -> torch.Tensor:
    """What the int4 kernel computes, in fp32: bf16 activations, bf16 scales and zeros, fp32 products."""
    bf = GroupQuantized(w.q, w.scale.to(KERNEL_DTYPE).float(), w.zero.to(KERNEL_DTYPE).float(), w.group_size,
                        w.bits, w.source)
    return x.to(KERNEL_DTYPE).float() @ dequantize(bf).t()


@needs_int4
@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1"])
def test_int4_linear_matches_the_dequantized_reference(qtype):
    rng = np.random.default_rng(1)
    values = (rng.standard_normal((96, 576)) * 0.05).astype(np.float32)
    blocks, _ = _gguf_blocks(values, qtype)
    w = from_gguf(qtype, blocks, values.shape)
    layer = Int4Linear(w, None)
    x = torch.randn(5, 576)
    with torch.inference_mode():
        got = layer(x.to(KERNEL_DTYPE)).float()
    ref = _kernel_reference(w, x)
    # the kernel rounds its fp32 sum to bf16 once: half a bf16 ulp of the result (plus summation order)
    assert ((got - ref).abs() <= ref.abs() * 2 ** -8 + 1e-3).all(), (got - ref).abs().max()
    # and against the file's exact fp16 scales: bf16 scales move a logit by about 2^-9 relative
    exact = x.to(KERNEL_DTYPE).float() @ dequantize(w).t()
    assert (got - exact).abs().max() <= exact.abs().max() * 2 ** -6


@needs_int8
def test_int8_linear_matches_its_codes_and_q8_0_requantizes_within_half_a_row_step():
    rng = np.random.default_rng(2)
    values = (rng.standard_normal((80, 96)) * 0.05).astype(np.float32)
    blocks, ref_values = _gguf_blocks(values, "Q8_0")
    w = from_gguf("Q8_0", blocks, values.shape)
    codes, scale = per_row_int8(w)
    row_values = codes.float() * scale[:, None]
    assert ((row_values - torch.from_numpy(ref_values)).abs() <= scale[:, None] * 0.5 + 1e-7).all()
    layer = Int8Linear(w, None)
    x = torch.randn(3, 96)
    with torch.inference_mode():
        got = layer(x.to(KERNEL_DTYPE)).float()
    ref = x.to(KERNEL_DTYPE).float() @ (codes.float() * scale.to(KERNEL_DTYPE).float()[:, None]).t()
    assert ((got - ref).abs() <= ref.abs() * 2 ** -7 + 1e-3).all(), (got - ref).abs().max()


@pytest.mark.parametrize("kind", [pytest.param("int4", marks=needs_int4), pytest.param("int8", marks=needs_int8)])
def test_each_row_is_computed_the_same_whatever_the_batch(kind):
    """Verifying n tokens in one forward must give the logits of n one-token steps (no near-tie can flip)."""
    torch.manual_seed(3)
    w = quantize(torch.randn(192, 576) * 0.05, 4 if kind == "int4" else 8)
    layer = Int4Linear(w, None) if kind == "int4" else Int8Linear(w, None)
    x = torch.randn(11, 576).to(KERNEL_DTYPE)
    with torch.inference_mode():
        together = layer(x)
        alone = torch.cat([layer(x[i:i + 1]) for i in range(len(x))])
        for n in (2, 3, 5):
            assert torch.equal(layer(x[:n]), together[:n]), n
    assert torch.equal(together, alone)


# -- the loader: per-tensor choice, --quantization, errors ------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    from tests.model.gguf_fixtures import make_source_checkpoint, write_gguf

    root = tmp_path_factory.mktemp("quant")
    out = {}
    for qtype in ("Q4_1", "Q8_0", "F16"):
        src = root / f"src-{qtype}"
        make_source_checkpoint(src, "llama")
        out[qtype] = (src, write_gguf(src, root / f"tiny-{qtype}.gguf", qtype, "llama"))
    return out


def _greedy(llm, n=16):
    from hyspec import SamplingParams

    return llm.generate(["def f(x):"], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))[0].outputs[0].token_ids


@needs_int4
@needs_int8
def test_a_q4_1_gguf_keeps_its_codes_by_default_and_speculation_is_identical(tiny_files):
    from hyspec import LLM
    from hyspec.cpu_ops.quantized_linear import QUANTIZED_HEADS

    from hyspec.cpu_ops.qgemm import BlockLinear, library

    _, path = tiny_files["Q4_1"]
    plain = LLM(str(path), kv_cache_bytes=4 << 20)
    report = plain.engine.quantization
    assert report.linears == {"int4 (Q4_1)": 8} and report.head == "int4 (Q4_1)", report.to_dict()
    # auto: fp32 activations over the file's blocks where hyspec's kernel builds, else torch's bf16 kernels
    exact = library() is not None
    assert plain.engine.dtype == (torch.float32 if exact else torch.bfloat16)
    assert type(plain.engine.model.layers[0].mlp.down_proj) is (BlockLinear if exact else Int4Linear)
    assert QUANTIZED_HEADS.get(plain.engine.model.lm_head_weight) is not None
    spec = LLM(str(path), kv_cache_bytes=4 << 20, speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    assert _greedy(spec) == _greedy(plain)
    dense = LLM(str(path), kv_cache_bytes=4 << 20, quantization="none")
    assert dense.engine.quantization.linears == {"dense": 8} and dense.engine.quantization.head == "dense"


@needs_int4
def test_bf16_uses_torchs_int4_kernel(tiny_files):
    from hyspec import LLM

    _, path = tiny_files["Q4_1"]
    llm = LLM(str(path), dtype="bfloat16", kv_cache_bytes=4 << 20)
    assert llm.engine.quantization.kernels == {"torch int4, bf16": 8}, llm.engine.quantization.to_dict()
    assert type(llm.engine.model.layers[1].self_attn.qkv_proj) is Int4Linear


@needs_int4
@needs_int8
def test_types_without_a_kernel_fall_back_with_one_line_and_int4_can_be_demanded(tiny_files, caplog):
    from hyspec import LLM

    _, path = tiny_files["F16"]
    with caplog.at_level("INFO", logger="hyspec.model.quantize_model"):
        llm = LLM(str(path), kv_cache_bytes=4 << 20)
    assert llm.engine.quantization.linears == {"dense": 8}
    lines = [r.getMessage() for r in caplog.records if "no cpu kernel" in r.getMessage()]
    assert lines == ["8 linear(s) stored as F16: no cpu kernel computes with them; dequantized"], lines
    demanded = LLM(str(path), kv_cache_bytes=4 << 20, quantization="int4")
    assert demanded.engine.quantization.linears == {"int4 (int4)": 8}
    assert demanded.engine.quantization.head == "int8 (int8)"
    assert len(_greedy(demanded)) == 16


@needs_int8
def test_int8_of_a_dense_checkpoint(tiny_files):
    from hyspec import LLM

    src, _ = tiny_files["F16"]
    llm = LLM(str(src), kv_cache_bytes=4 << 20, quantization="int8", dtype="bfloat16")
    assert llm.engine.quantization.linears == {"int8 (int8)": 8} and llm.engine.quantization.head == "int8 (int8)"
    spec = LLM(str(src), kv_cache_bytes=4 << 20, quantization="int8", dtype="bfloat16",
               speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    assert _greedy(spec) == _greedy(llm)


def test_unknown_quantization_is_named(tiny_files):
    from hyspec import LLM

    src, _ = tiny_files["F16"]
    with pytest.raises(ConfigError, match="unknown quantization 'fp4'; choose one of none, int4, int8"):
        LLM(str(src), kv_cache_bytes=4 << 20, quantization="fp4")


def test_demanded_quantization_without_a_kernel_is_an_error(tiny_files, monkeypatch):
    from hyspec import LLM
    from hyspec.backends.cpu import CPUBackend

    monkeypatch.setattr(CPUBackend, "quantized_linear", lambda self, w, bias, dtype, activations="native": None)
    src, path = tiny_files["Q4_1"]
    with pytest.raises(ConfigError, match="the cpu backend has no int4 kernel for layers.0.self_attn.qkv_proj"):
        LLM(str(src), kv_cache_bytes=4 << 20, quantization="int4")
    # not demanded: dense weights, the engine runs
    assert LLM(str(path), kv_cache_bytes=4 << 20).engine.quantization.linears == {"dense": 8}
