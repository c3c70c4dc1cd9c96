"""8-bit activations over llama.cpp's blocks (cpu_ops/qgemm_a8.c, ``quantization="a8"``): the error is exactly
the activations' rounding, every ISA gives the same bits, rows are independent of the batch and the
thread, the stack and speculation reproduce plain decoding, and the engine refuses what it cannot run."""
from __future__ import annotations

import pytest
import torch

from hyspec.cpu_ops import qgemm_a8 as a8
from hyspec.errors import ConfigError

gguf = pytest.importorskip("gguf")
from tests.test_cpu_ops_qgemm import _blocks  # noqa: E402  (the same GGUF-quantized matrices as the exact kernel's tests)
fast = a8.available()[0]
needs_kernel = pytest.mark.skipif(a8.library() is None, reason="no C compiler here: qgemm_a8 cannot build")
needs_vnni = pytest.mark.skipif(not fast, reason=f"quantization='a8' does not run here: {a8.available()[1]}")


def _x(rows: int, k: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g)
    x[0, min(40, k - 1)] = 9.0  # an outlier: its block's step is coarse, the others' fine
    if k > 64:
        x[rows - 1, 32:64] = 0.0  # an all-zero block of activations
    return x


@needs_kernel
@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("k", [32, 576, 1536, 544])  # one pair; a group and a pair; 3 groups; a group and an odd block
def test_the_error_is_the_activations_rounding_and_no_more(qtype, k):
    w, ref_w = _blocks(qtype, 21, k)
    x = _x(5, k)
    got = a8.qgemm_a8(qtype, x, a8.pack(qtype, w.blocks, 21, k), 21)
    ref = (x.double() @ ref_w.double().t())
    # each activation moves by at most half its block's step amax / 127, so y by at most sum_b step_b / 2 * |w|_b
    step = x.abs().view(5, -1, 32).amax(-1).double() / 127
    bound = torch.einsum("mb,nb->mn", step / 2, ref_w.abs().double().view(21, -1, 32).sum(-1))
    rounding = 1e-5 * (x.abs().double() @ ref_w.abs().double().t())  # the fp32 sums and scale products
    assert ((got.double() - ref).abs() <= bound + rounding).all(), ((got.double() - ref).abs() - bound).max()
    assert ((got.double() - ref).abs() > rounding).any()  # and it is not the exact kernel


@needs_kernel
@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
def test_the_portable_build_gives_the_native_builds_bits(qtype):
    portable = a8.variant("x86-64")
    if portable is None:
        pytest.skip("no portable build")
    for k in (32, 576, 1536, 544):
        w, _ = _blocks(qtype, 13, k, seed=k)
        x = _x(9, k, seed=k)
        packed = a8.pack(qtype, w.blocks, 13, k)
        assert torch.equal(a8.pack(qtype, w.blocks, 13, k, lib=portable), packed)
        assert torch.equal(a8.qgemm_a8(qtype, x, packed, 13, lib=portable), a8.qgemm_a8(qtype, x, packed, 13)), k


@needs_kernel
@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
def test_each_row_is_the_same_alone_in_any_batch_and_on_any_thread(qtype):
    w, _ = _blocks(qtype, 66, 1536, seed=1)
    packed = a8.pack(qtype, w.blocks, 66, 1536)
    x = _x(13, 1536, seed=1)
    together = a8.qgemm_a8(qtype, x, packed, 66)
    for n in (1, 2, 3, 5, 8, 9):
        assert torch.equal(a8.qgemm_a8(qtype, x[:n].contiguous(), packed, 66), together[:n]), n
    torch.set_num_threads(1)
    try:
        assert torch.equal(a8.qgemm_a8(qtype, x, packed, 66), together)
    finally:
        torch.set_num_threads(2)


@needs_kernel
@pytest.mark.parametrize("qtype", a8.A8_BLOCK_TYPES)
def test_whole_groups_read_the_gguf_bytes(qtype):
    """A decode step streams every matrix once, so the layout's size is its speed: a group of 16 blocks reads what
    the file stores, but for the K-quants' block scales and mins, a byte each where the file packs them in 6 bits."""
    from hyspec.cpu_ops.qgemm import BLOCK_BYTES, BLOCK_ELEMS, QTYPES

    k = 4096  # eight groups, no pairs
    stored = k // BLOCK_ELEMS[qtype] * BLOCK_BYTES[qtype]
    extra = k // 32 // 2 if qtype in ("Q4_K", "Q5_K") else 0  # 12 packed bytes per 256 weights become 16
    assert a8.library().hyspec_qgemm_a8_row_bytes(QTYPES[qtype], k) == stored + extra


@needs_kernel
def test_non_finite_activations_give_nan_and_bad_arguments_are_refused():
    w, _ = _blocks("Q4_1", 8, 576)
    packed = a8.pack("Q4_1", w.blocks, 8, 576)
    x = _x(2, 576)
    x[1, 100] = float("inf")
    y = a8.qgemm_a8("Q4_1", x, packed, 8)
    assert torch.isfinite(y[0]).all() and torch.isnan(y[1]).all()
    with pytest.raises(ValueError, match="is not a 8x512 Q4_1 one"):
        a8.qgemm_a8("Q4_1", torch.zeros(1, 512), packed, 8)
    with pytest.raises(ValueError, match="contiguous fp32"):
        a8.qgemm_a8("Q4_1", torch.zeros(1, 576, dtype=torch.float64), packed, 8)


@pytest.fixture(scope="module")
def tiny_q4_1(tmp_path_factory):
    from tests.model.gguf_fixtures import make_source_checkpoint, write_gguf

    root = tmp_path_factory.mktemp("a8")
    make_source_checkpoint(root / "src", "llama")
    return root / "src", write_gguf(root / "src", root / "tiny-Q4_1.gguf", "Q4_1", "llama")


def _greedy(llm, n=24):
    from hyspec import SamplingParams

    out = llm.generate(["def f(x):", "Hello"], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    return [o.outputs[0].token_ids for o in out]


@needs_vnni
def test_a8_engine_runs_the_stack_and_speculation_reproduces_its_plain_decoding(tiny_q4_1):
    from hyspec import LLM
    from hyspec.cpu_ops.decoder_stack import DecoderStack
    from hyspec.cpu_ops.qgemm import BlockLinear

    _, path = tiny_q4_1
    plain = LLM(str(path), kv_cache_bytes=4 << 20, quantization="a8")
    report = plain.engine.quantization
    assert report.kernels == {"hyspec qgemm, int8 activations": 8}, report.to_dict()
    assert report.head.endswith("int8 activations"), report.head
    down = plain.engine.model.layers[0].mlp.down_proj
    assert type(down) is BlockLinear and down.a8
    assert isinstance(plain.engine.model.layer_stack, DecoderStack)
    for method in ("ngram", "suffix"):
        spec = LLM(str(path), kv_cache_bytes=4 << 20, quantization="a8",
                   speculative_config={"method": method, "num_speculative_tokens": 3})
        assert _greedy(spec) == _greedy(plain), method


@needs_vnni
def test_a8_on_the_stack_equals_the_layer_loop_bit_for_bit(tiny_q4_1):
    from hyspec import LLM

    _, path = tiny_q4_1
    stacked = LLM(str(path), kv_cache_bytes=4 << 20, quantization="a8")
    loop = LLM(str(path), kv_cache_bytes=4 << 20, quantization="a8")
    loop.engine.model.layer_stack = None  # the same kernels called module by module
    assert _greedy(stacked) == _greedy(loop)


def test_a8_refusals_name_the_problem(tiny_q4_1, monkeypatch):
    from hyspec import LLM

    src, path = tiny_q4_1
    with pytest.raises(ConfigError, match="a8 needs a GGUF checkpoint"):
        LLM(str(src), kv_cache_bytes=4 << 20, quantization="a8")
    with pytest.raises(ConfigError, match="activations must be float32"):
        LLM(str(path), kv_cache_bytes=4 << 20, quantization="a8", dtype="bfloat16")
    monkeypatch.setattr(a8, "available", lambda: (False, "this CPU has no AVX-512 VNNI (test)"))
    with pytest.raises(ConfigError, match=r"no 8-bit-activation kernel for layers.0.self_attn.qkv_proj .*no AVX-512 VNNI"):
        LLM(str(path), kv_cache_bytes=4 << 20, quantization="a8")


def test_the_probe_lists_a8_exactly_where_it_runs(monkeypatch):
    from hyspec.backends.registry import get_backend

    backend = get_backend("cpu")
    assert ("gguf-blocks-a8" in backend.quantization_kernels()) == fast
    monkeypatch.setattr(a8, "available", lambda: (False, "test"))
    assert "gguf-blocks-a8" not in backend.quantization_kernels()


@needs_vnni
@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_a8_speculation_emits_its_plain_law_through_generate(tiny_q4_1, method):
    """Temperature 0.8 with top-k and top-p through LLM.generate: the first three tokens of 3,500 seeded
    requests follow the law of a8's own plain logits (a8 is its own target: its activations' rounding is
    part of the model being sampled, and verification must not change that law)."""
    from hyspec import LLM
    from hyspec.conformance.distribution import (DEFAULT_SAMPLES, compare, exact_law, lookup_prompt,
                                                 sample_through_generate)
    from hyspec.conformance.methods import CONTROLLER_OFF

    _, path = tiny_q4_1

    def engine(spec=None):
        return LLM(str(path), kv_cache_bytes=32 << 20, max_model_len=256, max_num_seqs=256, quantization="a8",
                   speculative_config=spec)

    plain = engine()
    base = plain.tokenizer.encode("def add(a, b):\n    return a + b\n\ndef")
    # the tokens y1 can be, appended until most of them appear in the prompt (6 of 8 here), so ngram drafts
    prompt = lookup_prompt(plain.engine, base, rounds=12)
    law = exact_law(plain.engine, prompt)
    lookup = {"prompt_lookup_min": 1, "prompt_lookup_max": 3} if method == "ngram" else {}
    llm = engine({**CONTROLLER_OFF, "method": method, "num_speculative_tokens": 3, **lookup})
    try:
        # suffix: 8 tokens, so that later requests draft from the cache of earlier responses (trees, forks)
        samples = sample_through_generate(llm, prompt, DEFAULT_SAMPLES, max_tokens=3 if method == "ngram" else 8)
        drafted = llm.engine.spec.metrics.snapshot()["totals"]["draft_tokens"]
    finally:
        llm.engine.spec.close()
    result = compare(samples, law)
    print(f"a8 {method}: {result.describe()}; {drafted} draft tokens")  # shown with -s
    assert drafted >= DEFAULT_SAMPLES // 4, f"{method}: only {drafted} draft tokens: the law would be plain's"
    assert result.passed, f"a8 {method}: {result.describe()}"
    assert result.power <= 0.05, result.describe()


@needs_kernel
def test_the_portable_opt_in_runs_a8_on_any_cpu_and_speculation_still_reproduces_its_plain_decoding(
        tiny_q4_1, monkeypatch):
    """HYSPEC_A8_PORTABLE=1 (for measuring a8's quality without VNNI, scripts/a8_quality.py) makes a8 run on
    the portable build: the contract is checked here on every CPU, not only where VNNI skips nothing."""
    from hyspec import LLM

    monkeypatch.delenv(a8.PORTABLE_OPT_IN, raising=False)
    if not fast:
        ok, why = a8.available()
        assert not ok and a8.PORTABLE_OPT_IN in why, why  # the refusal names the switch
    monkeypatch.setenv(a8.PORTABLE_OPT_IN, "1")
    assert a8.available() == (True, "")
    _, path = tiny_q4_1
    plain = LLM(str(path), kv_cache_bytes=4 << 20, quantization="a8")
    assert plain.engine.quantization.kernels == {"hyspec qgemm, int8 activations": 8}
    exact = LLM(str(path), kv_cache_bytes=4 << 20, dtype="float32")
    assert plain.engine.model.layers[0].mlp.down_proj.a8 and not exact.engine.model.layers[0].mlp.down_proj.a8
    spec = LLM(str(path), kv_cache_bytes=4 << 20, quantization="a8",
               speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    assert _greedy(spec) == _greedy(plain)


# -- blocks stored as Q5_0 and Q4_K (a Q4_K_M file's main types) --------------------------------------------------

def _stored(qtype: str, n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ``qtype`` blocks as the GGUF stores them and gguf's own dequantization of them."""
    from tests.test_cpu_ops_kquants import gguf_values, random_blocks

    raw = random_blocks(qtype, n, k, seed=seed)
    return torch.from_numpy(raw), gguf_values(qtype, raw, n, k)


@needs_kernel
@pytest.mark.parametrize("qtype,k", [("Q5_0", 32), ("Q5_0", 544), ("Q5_0", 1536), ("Q5_1", 32), ("Q5_1", 544),
                                     ("Q4_K", 256), ("Q4_K", 2304),
                                     ("Q4_K", 4096), ("Q5_K", 256), ("Q5_K", 2304), ("Q6_K", 256), ("Q6_K", 2304),
                                     ("Q6_K", 4096)])
def test_q5_and_k_quant_blocks_err_by_the_activations_rounding_alone_and_every_build_agrees(qtype, k):
    """256: pairs of blocks only; 2304: a group and four pairs; 4096: groups only (Q6_K: each half of a pair and
    of a group's blocks scaled on its own)"""
    blocks, ref_w = _stored(qtype, 21, k, seed=k)
    x = _x(5, k)
    packed = a8.pack(qtype, blocks, 21, k)
    got = a8.qgemm_a8(qtype, x, packed, 21)
    ref = x.double() @ ref_w.double().t()
    step = x.abs().view(5, -1, 32).amax(-1).double() / 127
    bound = torch.einsum("mb,nb->mn", step / 2, ref_w.abs().double().view(21, -1, 32).sum(-1))
    rounding = 1e-5 * (x.abs().double() @ ref_w.abs().double().t())
    assert ((got.double() - ref).abs() <= bound + rounding).all(), ((got.double() - ref).abs() - bound).max()
    assert ((got.double() - ref).abs() > rounding).any()
    for n in (1, 2, 4):  # rows alone or in any batch: the same bits
        assert torch.equal(a8.qgemm_a8(qtype, x[:n].contiguous(), packed, 21), got[:n]), n
    portable = a8.variant("x86-64")
    if portable is not None:
        assert torch.equal(a8.pack(qtype, blocks, 21, k, lib=portable), packed)
        assert torch.equal(a8.qgemm_a8(qtype, x, packed, 21, lib=portable), got)


@needs_kernel
def test_types_without_an_8_bit_kernel_and_misshapen_blocks_are_refused_by_name():
    with pytest.raises(ValueError, match="F32 blocks have no 8-bit-activation kernel"):
        a8.pack("F32", torch.zeros(4, 256 * 4, dtype=torch.uint8), 4, 256)
    q4k, _ = _stored("Q4_K", 4, 512)
    with pytest.raises(ValueError, match=r"cannot pack \(4, 288\) torch.uint8 as a 4x256 Q4_K matrix"):
        a8.pack("Q4_K", q4k, 4, 256)


@needs_vnni
def test_a8_on_a_q4_k_m_like_file_runs_every_matrix_and_speculation_reproduces_it(tmp_path):
    from hyspec import LLM
    from hyspec.cpu_ops.qgemm import BlockLinear, RowConcatLinear
    from tests.test_cpu_ops_kquants import write_k_quant_gguf

    path = write_k_quant_gguf(tmp_path / "q4_k_m.gguf", tmp_path)
    plain = LLM(str(path), kv_cache_bytes=4 << 20, quantization="a8")
    report = plain.engine.quantization
    # Q4_K everywhere, Q6_K v / down in layer 0 and in the head: every matrix takes 8-bit activations
    assert report.kernels == {"hyspec qgemm, int8 activations": 8} and not report.fallbacks, report.to_dict()
    assert report.head == "int6 (Q6_K), int8 activations", report.head
    layers = plain.engine.model.layers
    qkv = layers[0].self_attn.qkv_proj
    assert isinstance(qkv, RowConcatLinear) and [p.a8 for p in qkv.parts] == [True, True, True]
    assert type(layers[0].mlp.down_proj) is BlockLinear and layers[0].mlp.down_proj.block_type == "Q6_K"
    assert layers[0].mlp.down_proj.a8 and layers[1].mlp.down_proj.a8
    stacked = _greedy(plain)
    loop = LLM(str(path), kv_cache_bytes=4 << 20, quantization="a8")
    loop.engine.model.layer_stack = None  # the same kernels module by module
    assert _greedy(loop) == stacked
    spec = LLM(str(path), kv_cache_bytes=4 << 20, quantization="a8",
               speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    assert _greedy(spec) == stacked


@needs_vnni
def test_a8_keeps_fp32_activations_for_a_type_without_the_kernel_and_says_so(tmp_path, monkeypatch):
    from hyspec import LLM
    from tests.test_cpu_ops_kquants import write_k_quant_gguf

    path = write_k_quant_gguf(tmp_path / "q4_k_m.gguf", tmp_path)
    monkeypatch.setattr(a8, "A8_BLOCK_TYPES", tuple(t for t in a8.A8_BLOCK_TYPES if t != "Q6_K"))
    report = LLM(str(path), kv_cache_bytes=4 << 20, quantization="a8").engine.quantization
    assert report.kernels == {"hyspec qgemm, int8 activations": 6, "hyspec qgemm, fp32": 1,
                              "hyspec qgemm, int8 activations + fp32": 1}, report.to_dict()
    assert report.head == "int6 (Q6_K)"
    assert report.fallbacks == [
        "a8: 1 linear(s) stored as Q4_K+Q6_K keep fp32 activations for their Q6_K rows (no 8-bit-activation kernel "
        "for Q6_K)",
        "a8: 1 linear(s) stored as Q6_K keep fp32 activations (no 8-bit-activation kernel for Q6_K)",
        "a8: the lm_head stored as Q6_K keeps fp32 activations (no 8-bit-activation kernel for Q6_K)"], report.fallbacks
