"""hyspec's CPU kernel over llama.cpp's blocks (cpu_ops/qgemm.c): the file's values in fp32, rows independent
of the batch, the build and its fall-back, and an engine on a GGUF computing exactly what dense fp32 does."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from hyspec.cpu_ops import qgemm as qg
from hyspec.model.quant import dequantize, encode_blocks, from_gguf, quantize

gguf = pytest.importorskip("gguf")
needs_kernel = pytest.mark.skipif(qg.library() is None, reason="no C compiler here: hyspec's qgemm cannot build")


def _blocks(qtype: str, n: int, k: int, seed: int = 0):
    from gguf import quants

    rng = np.random.default_rng(seed)
    values = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    values[1, :32] = 0.0  # an all-zero block
    t = getattr(gguf.GGMLQuantizationType, qtype)
    raw = quants.quantize(values, t)
    return from_gguf(qtype, raw, (n, k)), torch.from_numpy(quants.dequantize(raw, t).astype(np.float32))


@needs_kernel
@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("rows", [1, 2, 3, 9])
def test_matches_an_fp32_product_with_the_dequantized_matrix(qtype, rows):
    w, ref_w = _blocks(qtype, 52, 576)  # 52: a last block of output rows that is not full
    x = torch.randn(rows, 576)
    got = qg.qgemm(qtype, x, w.blocks, 52)
    ref = (x.double() @ ref_w.double().t()).float()
    # fp32 sums in another order than the float64 reference: a few ulps of the larger partial sums
    bound = 1e-6 * (x.abs().double() @ ref_w.abs().double().t()).float() + 1e-7
    assert ((got - ref).abs() <= bound * 8).all(), (got - ref).abs().max()


@needs_kernel
@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
def test_each_row_is_the_same_alone_or_in_any_batch(qtype):
    w, _ = _blocks(qtype, 64, 1536, seed=1)
    x = torch.randn(13, 1536)
    together = qg.qgemm(qtype, x, w.blocks, 64)
    for n in (1, 2, 3, 5, 8):
        assert torch.equal(qg.qgemm(qtype, x[:n].contiguous(), w.blocks, 64), together[:n]), n
    torch.set_num_threads(1)
    try:
        one_thread = qg.qgemm(qtype, x, w.blocks, 64)
    finally:
        torch.set_num_threads(2)
    assert torch.equal(one_thread, together)  # and whatever thread computes a row


def _marches() -> list[str]:
    """The -march builds this CPU can run: portable, AVX2 (haswell) where present, and its own (AVX-512 here or not)."""
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        return ["native"]
    from hyspec.cpu_ops.native import _cpu_key

    flags = set(_cpu_key().split())
    return ["x86-64", *(["haswell"] if {"avx2", "fma", "f16c"} <= flags else []), "native"]


@needs_kernel
@pytest.mark.parametrize("march", _marches())
@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
def test_every_isa_path_is_exact_and_batch_invariant(qtype, march):
    """What each CPU runs -- portable (no AVX2), AVX2, AVX-512 -- built here for every level this CPU has."""
    lib = qg.variant(march)
    w, ref_w = _blocks(qtype, 52, 576, seed=3)
    x = torch.randn(13, 576)
    together = qg.qgemm(qtype, x, w.blocks, 52, lib=lib)
    for n in (1, 2, 5, 9):
        assert torch.equal(qg.qgemm(qtype, x[:n].contiguous(), w.blocks, 52, lib=lib), together[:n]), (march, n)
    ref = (x.double() @ ref_w.double().t()).float()
    bound = 1e-6 * (x.abs().double() @ ref_w.abs().double().t()).float() + 1e-7
    assert ((together - ref).abs() <= bound * 8).all(), march


@needs_kernel
@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
def test_the_portable_path_sums_in_the_avx2_paths_order(qtype):
    """The portable build is the AVX2 build's arithmetic without vectors: equal bit for bit (AVX-512 sums in
    sixteen lanes, another order: close, not equal)."""
    if "haswell" not in _marches():
        pytest.skip("this CPU cannot run the AVX2 build")
    assert qg.isa(qg.variant("x86-64")) == "portable" and qg.isa(qg.variant("haswell")) == "avx2+fma+f16c"
    w, _ = _blocks(qtype, 52, 576, seed=4)
    x = torch.randn(9, 576)
    assert torch.equal(qg.qgemm(qtype, x, w.blocks, 52, lib=qg.variant("x86-64")),
                       qg.qgemm(qtype, x, w.blocks, 52, lib=qg.variant("haswell")))


@needs_kernel
@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
def test_many_rows_alone_or_in_batches_of_1_to_33_on_every_isa_path(qtype):
    """The many-row kernels (verification, prefill: chunks of eight rows, output rows in groups of up to 32,
    the block sums of eight rows in one vector) against the one-row path and the portable build: every row
    equal bit for bit to itself computed alone, in any batch of 1..33 rows, with any thread count."""
    w, _ = _blocks(qtype, 100, 576, seed=5)  # 100 outputs: groups that end part-way through a block of four
    x = torch.randn(33, 576)
    for march in _marches():
        lib = qg.variant(march)
        alone = torch.cat([qg.qgemm(qtype, x[m:m + 1].contiguous(), w.blocks, 100, lib=lib) for m in range(33)])
        for n in range(1, 34):
            assert torch.equal(qg.qgemm(qtype, x[:n].contiguous(), w.blocks, 100, lib=lib), alone[:n]), (march, n)
        if march == "x86-64":
            portable = alone
        elif qg.isa(lib) != "avx512f+f16c":  # AVX-512 sums in sixteen lanes: another order
            assert torch.equal(alone, portable), march
    together = qg.qgemm(qtype, x, w.blocks, 100)
    torch.set_num_threads(1)  # fewer threads: other output groups per task, the same bits
    try:
        assert torch.equal(qg.qgemm(qtype, x, w.blocks, 100), together)
    finally:
        torch.set_num_threads(2)


def test_quantize_writes_blocks_that_mean_the_same_values():
    torch.manual_seed(0)
    dense = torch.randn(48, 96) * 0.1
    for bits, qtype in ((4, "Q4_1"), (8, "Q8_0")):
        w = quantize(dense, bits)
        block_type, raw = encode_blocks(w)
        assert block_type == qtype and raw.shape == (48, 3 * qg.BLOCK_BYTES[qtype])
        again = from_gguf(qtype, raw.numpy(), (48, 96))
        assert torch.equal(dequantize(again), dequantize(w))


@needs_kernel
def test_bad_arguments_are_refused():
    w, _ = _blocks("Q4_1", 16, 64)
    with pytest.raises(ValueError, match="contiguous fp32 x"):
        qg.qgemm("Q4_1", torch.randn(2, 64, dtype=torch.float64), w.blocks, 16)
    with pytest.raises(ValueError, match="do not hold a 16x96 Q4_1 matrix"):
        qg.qgemm("Q4_1", torch.randn(2, 96), w.blocks, 16)


def test_no_compiler_falls_back_to_torchs_kernels(tmp_path):
    """A fresh process without a compiler: library() is None, the log says why, the engine still quantizes."""
    code = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout)\n"
            "import torch\nfrom hyspec.cpu_ops import qgemm\nprint('LIB', qgemm.library())\n"
            "from hyspec.backends.cpu import CPUBackend\nprint('ACT', CPUBackend.quantized_activation_dtype(None))\n")
    env = dict(os.environ, CC=str(tmp_path / "no-such-cc"), HYSPEC_CACHE_DIR=str(tmp_path / "cache"),
               TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "LIB None" in done.stdout and "ACT None" in done.stdout
    assert "qgemm kernel cannot be built" in done.stdout, done.stdout


@needs_kernel
def test_engine_on_a_q4_1_gguf_in_fp32_computes_the_files_values(tmp_path):
    """The default for a GGUF on this CPU: its blocks, fp32 activations; logits as dense fp32 on the same values."""
    from hyspec import LLM, SamplingParams
    from tests.model.gguf_fixtures import make_source_checkpoint, write_gguf

    src = tmp_path / "src"
    make_source_checkpoint(src, "llama")
    path = write_gguf(src, tmp_path / "tiny.gguf", "Q4_1", "llama")
    quant = LLM(str(path), kv_cache_bytes=4 << 20)
    dense = LLM(str(path), kv_cache_bytes=4 << 20, dtype="float32", quantization="none")
    assert quant.engine.quantization.kernels == {"hyspec qgemm, fp32": 8}
    ids = torch.arange(3, 200, 7)
    a, b = quant.engine.model, dense.engine.model
    with torch.inference_mode():
        la = a.compute_logits(a.forward_dense(ids[None]).hidden[0])
        lb = b.compute_logits(b.forward_dense(ids[None]).hidden[0])
    assert (la - lb).abs().max() < 1e-4 * lb.abs().max()
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    spec = LLM(str(path), kv_cache_bytes=4 << 20, speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    assert spec.generate(["def f(x):"], params)[0].outputs[0].token_ids == \
        quant.generate(["def f(x):"], params)[0].outputs[0].token_ids
