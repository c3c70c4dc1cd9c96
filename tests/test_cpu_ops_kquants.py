"""Q5_0, Q5_1, Q4_K, Q5_K and Q6_K computed from their stored blocks through qgemm, on every ISA build this CPU
runs, rows independent of the batch: Q5_1 and the K-quants (cpu_ops/kquants.c) bit for bit the same kernel on the
gguf package's dequantized matrix; Q5_0 (qgemm.c) bit for bit Q8_0 on the same codes and scales; and a model on a
Q4_K_M-like GGUF decoding the tokens of its dense-dequantized path."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hyspec.cpu_ops import qgemm as qg
from hyspec.model.quant import concat_rows, dequantize, permute_rows, stored_blocks

gguf = pytest.importorskip("gguf")
needs_kernel = pytest.mark.skipif(qg.library() is None, reason="no C compiler here: hyspec's qgemm cannot build")

TYPES = ["Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
#: the types summed as the F32 type sums gguf's dequantized matrix (Q5_0 is summed as Q8_0)
DENSE_ORDER_TYPES = ["Q5_1", "Q4_K", "Q5_K", "Q6_K"]
#: byte offsets of each type's fp16 scale fields (d, dmin / m), from gguf's quants.py layouts
_FP16_FIELDS = {"Q5_0": (0,), "Q5_1": (0, 2), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def random_blocks(qtype: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """``[n, bytes per row]`` blocks of ``qtype``: every code and packed scale random, the fp16 scales of a weight
    scale (the gguf package quantizes none of the K-quants, so the blocks are built from the published layout).
    One all-zero block and one with a subnormal scale ride along."""
    t = getattr(gguf.GGMLQuantizationType, qtype)
    elems, nbytes = gguf.GGML_QUANT_SIZES[t]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n, k // elems, nbytes), dtype=np.uint8)
    for off in _FP16_FIELDS[qtype]:
        scales = (rng.standard_normal((n, k // elems)) * 2e-3).astype(np.float16)
        raw[..., off:off + 2] = scales.view(np.uint8).reshape(n, k // elems, 2)
    raw[0, 0] = 0
    raw[1, 0, _FP16_FIELDS[qtype][0]:_FP16_FIELDS[qtype][0] + 2] = np.array([3e-6], np.float16).view(np.uint8)
    return raw.reshape(n, -1)


def gguf_values(qtype: str, raw: np.ndarray, n: int, k: int) -> torch.Tensor:
    t = getattr(gguf.GGMLQuantizationType, qtype)
    return torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(raw, t), dtype=np.float32).reshape(n, k))


def q5_0_as_q8_0(raw: np.ndarray) -> torch.Tensor:
    """Q5_0 blocks ``[n, bytes per row]`` re-encoded, exactly, as Q8_0 blocks: the same fp16 d, and each
    weight's centred code q - 16 as the int8 code (gguf's layout: d, 4 bytes qh, 16 bytes of nibbles)."""
    n = raw.shape[0]
    b = raw.reshape(n, -1, 22)
    qh = b[..., 2:6].copy().view("<u4")[..., 0]
    nib = np.concatenate([b[..., 6:] & 0x0F, b[..., 6:] >> 4], axis=-1).astype(np.int16)
    high = (qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1
    codes = (nib | (high.astype(np.int16) << 4)) - 16
    out = np.concatenate([b[..., :2], codes.astype(np.int8).view(np.uint8)], axis=-1)
    return torch.from_numpy(np.ascontiguousarray(out.reshape(n, -1)))


def _reference(qtype: str, raw: np.ndarray, n: int, k: int) -> tuple[str, torch.Tensor]:
    """The type and blocks whose result ``qtype``'s blocks must equal bit for bit: Q8_0 for Q5_0, else F32."""
    if qtype == "Q5_0":
        return "Q8_0", q5_0_as_q8_0(raw)
    return "F32", dense_bytes(gguf_values(qtype, raw, n, k))


def dense_bytes(values: torch.Tensor) -> torch.Tensor:
    """A dense fp32 matrix as qgemm's F32 type takes it (its bytes, row by row)."""
    return values.contiguous().view(torch.uint8).reshape(values.shape[0], -1)


def _marches() -> list[str]:
    from tests.test_cpu_ops_qgemm import _marches as marches

    return marches()


@needs_kernel
@pytest.mark.parametrize("march", _marches())
@pytest.mark.parametrize("qtype", DENSE_ORDER_TYPES)
def test_blocks_compute_exactly_what_the_kernel_does_on_ggufs_dequantized_matrix(qtype, march):
    """Per ISA build: the blocks give the bit-identical result of the F32 type (the same summation) on gguf's
    values, for one row, a few and more than a chunk of eight; and that is an fp32 product (float64 bound)."""
    lib = qg.variant(march)
    n, k = 13, 512 if qtype.endswith("_K") else 96
    raw = random_blocks(qtype, n, k)
    values = gguf_values(qtype, raw, n, k)
    blocks = torch.from_numpy(raw)
    for rows in (1, 2, 3, 4, 9, 33):  # decode; tiles of three rows of x and their remainders
        x = torch.randn(rows, k)
        got = qg.qgemm(qtype, x, blocks, n, lib=lib)
        assert torch.equal(got, qg.qgemm("F32", x, dense_bytes(values), n, lib=lib)), (march, rows)
        ref = x.double() @ values.double().t()
        bound = 1e-6 * (x.abs().double() @ values.abs().double().t()) + 1e-7
        assert ((got.double() - ref).abs() <= bound * 8).all(), (march, rows)


@needs_kernel
@pytest.mark.parametrize("march", _marches())
def test_q5_0_computes_exactly_what_q8_0_does_on_its_codes(march):
    """Per ISA build: Q5_0 blocks give, bit for bit, Q8_0's result on the same d and centred codes (its kernel
    path, decode and many rows alike), and that is an fp32 product of gguf's values (float64 bound)."""
    lib = qg.variant(march)
    n, k = 13, 96
    raw = random_blocks("Q5_0", n, k)
    values = gguf_values("Q5_0", raw, n, k)
    as_q8 = q5_0_as_q8_0(raw)
    assert torch.equal(gguf_values("Q8_0", as_q8.numpy(), n, k), values)  # the re-encoding is exact
    blocks = torch.from_numpy(raw)
    for rows in (1, 2, 3, 4, 9, 33):
        x = torch.randn(rows, k)
        got = qg.qgemm("Q5_0", x, blocks, n, lib=lib)
        assert torch.equal(got, qg.qgemm("Q8_0", x, as_q8, n, lib=lib)), (march, rows)
        ref = x.double() @ values.double().t()
        bound = 1e-6 * (x.abs().double() @ values.abs().double().t()) + 1e-7
        assert ((got.double() - ref).abs() <= bound * 8).all(), (march, rows)


@needs_kernel
@pytest.mark.parametrize("qtype", ["Q5_0", "Q4_K", "Q6_K"])
def test_long_rows_dequantize_fewer_outputs_at_once_with_the_same_sums(qtype):
    """Rows longer than the many-rows path's buffer (16384 weights) holds for a task's outputs: it dequantizes
    fewer output rows at a time; the sums stay the F32 type's (Q5_0: Q8_0's), bit for bit, whatever the row count."""
    n, k = 7, 8192
    raw = random_blocks(qtype, n, k, seed=4)
    ref_type, ref = _reference(qtype, raw, n, k)
    x = torch.randn(5, k)
    for rows in (1, 2, 5):
        xr = x[:rows].contiguous()
        assert torch.equal(qg.qgemm(qtype, xr, torch.from_numpy(raw), n), qg.qgemm(ref_type, xr, ref, n)), rows


@needs_kernel
@pytest.mark.parametrize("qtype", ["Q5_0", "Q5_1"])
def test_blocks_the_gguf_writer_quantizes_compute_exactly(qtype):
    """Q5_0 / Q5_1 as the gguf package itself quantizes them (the K-quants it cannot write)."""
    n, k = 20, 160
    dense = (np.random.default_rng(5).standard_normal((n, k)) * 0.05).astype(np.float32)
    raw = gguf.quants.quantize(dense, getattr(gguf.GGMLQuantizationType, qtype))
    x = torch.randn(4, k)
    ref_type, ref = _reference(qtype, raw, n, k)
    assert torch.equal(qg.qgemm(qtype, x, torch.from_numpy(raw), n), qg.qgemm(ref_type, x, ref, n))


@needs_kernel
@pytest.mark.parametrize("qtype", TYPES)
def test_each_row_is_the_same_alone_in_any_batch_and_on_any_thread(qtype):
    n, k = 20, 512 if qtype.endswith("_K") else 160
    blocks = torch.from_numpy(random_blocks(qtype, n, k, seed=2))
    x = torch.randn(11, k)
    together = qg.qgemm(qtype, x, blocks, n)
    for rows in (1, 2, 3, 5, 8, 9):
        assert torch.equal(qg.qgemm(qtype, x[:rows].contiguous(), blocks, n), together[:rows]), rows
    for i in (0, 4, 10):  # a row alone (the decode path) equals its place in the many-rows path
        assert torch.equal(qg.qgemm(qtype, x[i:i + 1].contiguous(), blocks, n), together[i:i + 1]), i
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert torch.equal(qg.qgemm(qtype, x, blocks, n), together)
    finally:
        torch.set_num_threads(threads)


@needs_kernel
@pytest.mark.parametrize("qtype", TYPES)
def test_the_portable_build_sums_in_the_avx2_builds_order(qtype):
    if "haswell" not in _marches():
        pytest.skip("this CPU cannot run the AVX2 build")
    n, k = 9, 512 if qtype.endswith("_K") else 96
    blocks = torch.from_numpy(random_blocks(qtype, n, k, seed=3))
    x = torch.randn(3, k)
    assert torch.equal(qg.qgemm(qtype, x, blocks, n, lib=qg.variant("x86-64")),
                       qg.qgemm(qtype, x, blocks, n, lib=qg.variant("haswell")))


@needs_kernel
def test_bad_shapes_and_types_are_refused():
    blocks = torch.from_numpy(random_blocks("Q4_K", 4, 512))
    with pytest.raises(ValueError, match="do not hold a 4x384 Q4_K matrix"):
        qg.qgemm("Q4_K", torch.randn(1, 384), blocks, 4)
    with pytest.raises(ValueError, match="unknown block type 'Q3_K'"):
        qg.qgemm("Q3_K", torch.randn(1, 512), blocks, 4)


def test_stored_blocks_keep_the_file_and_join_by_type():
    """Blocks-only matrices: values are gguf's, permuting rows permutes blocks, like types join into one matrix
    and unlike ones stay parts (a Q4_K_M file's Q4_K q/k beside a Q6_K v)."""
    q_raw, v_raw = random_blocks("Q4_K", 8, 256), random_blocks("Q6_K", 4, 256, seed=1)
    q, v = stored_blocks("Q4_K", q_raw, (8, 256), "q"), stored_blocks("Q6_K", v_raw, (4, 256), "v")
    assert q.shape == (8, 256) and q.q is None and torch.equal(dequantize(q), gguf_values("Q4_K", q_raw, 8, 256))
    rows = torch.tensor([3, 1, 0, 2, 7, 6, 5, 4])
    assert torch.equal(dequantize(permute_rows(q, rows)), dequantize(q)[rows])
    same = concat_rows([q, q])
    assert same.block_type == "Q4_K" and same.shape == (16, 256) and not same.parts
    mixed = concat_rows([q, q, v])
    assert mixed.shape == (20, 256) and [p.block_type for p in mixed.parts] == ["Q4_K", "Q4_K", "Q6_K"]
    assert torch.equal(dequantize(mixed), torch.cat([dequantize(q), dequantize(q), dequantize(v)]))
    assert stored_blocks("Q8_0", q_raw, (8, 256)) is None  # a group type: from_gguf's
    from hyspec.errors import CheckpointError

    with pytest.raises(CheckpointError, match="not a whole number of 256-weight blocks"):
        stored_blocks("Q4_K", q_raw, (8, 288), "t")


# -- a model on a Q4_K_M-like file ------------------------------------------------------------------------------

#: what llama.cpp's Q4_K_M writes for a Llama (llama-quant.cpp's type choice): Q6_K for v and down in some
#: layers and for the output, Q4_K elsewhere; here layer 0 takes the Q6_K ones, layer 1 is all Q4_K, and the
#: embedding Q5_0 (a Q5_0 matrix reaches the head only when tied: covered by the kernel tests above)
def _q4_k_m_type(gguf_name: str) -> str:
    if gguf_name == "output.weight":
        return "Q6_K"
    if gguf_name == "token_embd.weight":
        return "Q5_0"
    if gguf_name.startswith("blk.0.") and gguf_name.split(".")[2] in ("attn_v", "ffn_down"):
        return "Q6_K"
    return "Q4_K"


def write_k_quant_gguf(path, tmp_path):
    """A 2-layer Llama (hidden 256, intermediate 512: whole K-quant super-blocks) with random blocks."""
    from tests.model.gguf_fixtures import _add_tokenizer
    from tests.model.tiny_checkpoint import VOCAB, write_tokenizer

    src = tmp_path / "src"
    src.mkdir()
    write_tokenizer(src)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_context_length(256)
    w.add_embedding_length(256)
    w.add_feed_forward_length(512)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(VOCAB)
    _add_tokenizer(w, src)
    shapes = {"token_embd.weight": (VOCAB, 256), "output.weight": (VOCAB, 256), "output_norm.weight": (256,)}
    for i in range(2):
        for name, shape in (("attn_q", (256, 256)), ("attn_k", (128, 256)), ("attn_v", (128, 256)),
                            ("attn_output", (256, 256)), ("ffn_gate", (512, 256)), ("ffn_up", (512, 256)),
                            ("ffn_down", (256, 512)), ("attn_norm", (256,)), ("ffn_norm", (256,))):
            shapes[f"blk.{i}.{name}.weight"] = shape
    rng = np.random.default_rng(0)
    for seed, (name, shape) in enumerate(shapes.items()):
        if len(shape) == 1:
            w.add_tensor(name, (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32))
            continue
        qtype = _q4_k_m_type(name)
        raw = random_blocks(qtype, *shape, seed=seed)
        w.add_tensor(name, raw, raw_dtype=getattr(gguf.GGMLQuantizationType, qtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@needs_kernel
def test_a_q4_k_m_like_gguf_decodes_its_dense_paths_tokens_from_the_blocks(tmp_path):
    from hyspec import LLM, SamplingParams
    from hyspec.cpu_ops import decoder_stack
    from hyspec.cpu_ops.qgemm import BlockLinear, RowConcatLinear

    path = write_k_quant_gguf(tmp_path / "q4_k_m.gguf", tmp_path)
    quant = LLM(str(path), kv_cache_bytes=4 << 20)
    report = quant.engine.quantization
    assert report.kernels == {"hyspec qgemm, fp32": 8} and not report.fallbacks, report.to_dict()
    assert report.head == "int6 (Q6_K)"
    layers = quant.engine.model.layers
    assert isinstance(layers[0].self_attn.qkv_proj, RowConcatLinear)  # Q4_K q/k, Q6_K v
    assert [p.block_type for p in layers[0].self_attn.qkv_proj.parts] == ["Q4_K", "Q4_K", "Q6_K"]
    assert isinstance(layers[1].self_attn.qkv_proj, BlockLinear) and layers[1].mlp.down_proj.block_type == "Q4_K"
    if decoder_stack.library() is not None:  # the decoder stack runs the mixed-type projections too
        assert quant.engine.model.layer_stack is not None
    dense = LLM(str(path), kv_cache_bytes=4 << 20, dtype="float32", quantization="none")
    ids = torch.arange(3, 200, 7)
    a, b = quant.engine.model, dense.engine.model
    with torch.inference_mode():
        la = a.compute_logits(a.forward_dense(ids[None]).hidden[0])
        lb = b.compute_logits(b.forward_dense(ids[None]).hidden[0])
    assert (la - lb).abs().max() < 1e-4 * lb.abs().max()
    stack, a.layer_stack = a.layer_stack, None  # the layer loop over the same modules
    try:
        with torch.inference_mode():
            lc = a.compute_logits(a.forward_dense(ids[None]).hidden[0])
    finally:
        a.layer_stack = stack
    assert (la - lc).abs().max() < 1e-4 * lc.abs().max()
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    plain = quant.generate(["def f(x):"], params)[0].outputs[0].token_ids
    assert plain == dense.generate(["def f(x):"], params)[0].outputs[0].token_ids
    spec = LLM(str(path), kv_cache_bytes=4 << 20, speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    assert spec.generate(["def f(x):"], params)[0].outputs[0].token_ids == plain


@needs_kernel
@pytest.mark.parametrize("qtype", ["Q4_0", "Q5_0", "Q8_0", "Q4_K", "Q6_K"])
@pytest.mark.parametrize("k", [576, 2304, 4096])
def test_prefill_sized_batches_give_each_row_its_value_alone(qtype, k):
    """Prefill-sized batches (the dequantized-panel paths: 4 outputs x 6 rows for the 32-weight types, 2 outputs x
    3 rows for the K-quants, K in blocks from 2048 weights) against each row computed alone: output counts that
    leave partial groups, panels and an odd output, row counts that cross the chunks of x and leave short tiles,
    and long rows whose last block of K is short (2304)."""
    if qtype.endswith("_K") and k % 256:
        pytest.skip("K-quants need rows of whole super-blocks")
    n = 102 if k == 576 else 21
    raw = random_blocks(qtype, n, k, seed=6) if qtype in TYPES else _blocks_of(qtype, n, k)
    blocks = torch.from_numpy(raw)
    x = torch.randn(121 if k == 576 else 52, k)
    alone = torch.cat([qg.qgemm(qtype, x[m:m + 1].contiguous(), blocks, n) for m in range(x.shape[0])])
    for rows in ((32, 33, 47, 108, 121) if k == 576 else (32, 40, 52)):
        assert torch.equal(qg.qgemm(qtype, x[:rows].contiguous(), blocks, n), alone[:rows]), rows


def _blocks_of(qtype: str, n: int, k: int) -> np.ndarray:
    """Q4_0 / Q8_0 blocks as the gguf package quantizes them."""
    dense = (np.random.default_rng(7).standard_normal((n, k)) * 0.05).astype(np.float32)
    return gguf.quants.quantize(dense, getattr(gguf.GGMLQuantizationType, qtype))
