"""DSpark: the decoder (processing, cut, ONNX Runtime parity), greedy identity, losslessness at T > 0, bad input."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from hyspec.drafters.dflash.checkpoint import load_drafter, save_drafter
from hyspec.drafters.dflash.model import DFlashConfig, default_target_layers
from hyspec.drafters.dspark.decoder import DecodedBlock, DSparkDecoder, OnnxDecoder, decode_block, export_onnx, \
    process_static
from hyspec.drafters.dspark.model import DSparkDrafter
from hyspec.errors import CheckpointError
from hyspec.model.loader import load_model
from hyspec.ops.sampling import SamplingTensors, process_logits
from tests.drafters.hidden_drafters import (  # noqa: F401  (fixtures)
    assert_clean_pool, decode_chains, generate_in_batches, plain, spec_llm, target_dir, totals,
    train_drafter)

BLOCK = 4


@pytest.fixture(scope="module")
def target(target_dir):
    return load_model(target_dir, dtype="float32")


def random_decoder(vocab: int, hidden: int, rank: int, seed: int, scale: float = 1.0) -> DSparkDecoder:
    """A decoder whose Markov bias and confidence really depend on their inputs."""
    torch.manual_seed(seed)
    decoder = DSparkDecoder(vocab, hidden, rank)
    with torch.no_grad():
        decoder.markov_in.weight.normal_(0, scale)
        decoder.markov_out.weight.normal_(0, scale)
        decoder.confidence.weight.normal_(0, scale)
        decoder.confidence.bias.fill_(0.5)
    return decoder.eval()


def random_dspark(target, seed: int = 1, cut_threshold: float = 0.1) -> DSparkDrafter:
    torch.manual_seed(seed)
    cfg = DFlashConfig(dataclasses.replace(target.config, num_hidden_layers=1),
                       default_target_layers(target.config.num_hidden_layers), BLOCK)
    return DSparkDrafter(cfg, target.embed_tokens.weight, target.lm_head_weight, max_positions=256, markov_rank=8,
                         cut_threshold=cut_threshold).eval()


def _build(target):
    return lambda config, section: DSparkDrafter(config, target.embed_tokens.weight, target.lm_head_weight,
                                                 max_positions=256, markov_rank=section["markov_rank"],
                                                 cut_threshold=section["cut_threshold"])


def _sampling_rows(n: int) -> SamplingTensors:
    """Greedy, plain, top-k, top-p and min-p rows, cycling."""
    kinds = [(0.0, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.0), (0.7, 20, 1.0, 0.0), (1.3, 0, 0.8, 0.0), (0.9, 50, 0.9, 0.05)]
    rows = [kinds[i % len(kinds)] for i in range(n)]
    return SamplingTensors.from_lists(*(list(col) for col in zip(*rows)))


@pytest.fixture(scope="module")
def trained_dir(target_dir, plain, tmp_path_factory):
    out = tmp_path_factory.mktemp("dspark_trained")
    metrics = train_drafter("dspark", target_dir, out, plain["sequences"], steps=200,
                            options={"block_size": BLOCK, "layers": 1, "anchors": 48, "markov_rank": 16})
    assert metrics["accepted_len"] > 2.5, metrics
    return out


def test_static_processing_equals_the_targets_processing():
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(60, 50, generator=g) * 3).round() / 2  # many exact ties
    logits[7, 3] = float("nan")
    logits[8] = float("-inf")
    sampling = _sampling_rows(60)
    ours = process_static(logits, sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p)
    theirs = process_logits(logits, sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p)
    assert torch.allclose(ours, theirs, atol=1e-6)


def test_static_processing_without_top_k_or_top_p_skips_the_sort_and_agrees():
    """Greedy, temperature and min-p rows only: the eager path skips the vocabulary sort (a DSpark draft
    step's main cost) and must give what the target's processing and the sorted static path give."""
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(40, 50, generator=g) * 3).round() / 2
    logits[5, 2] = float("nan")
    kinds = [(0.0, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.0), (0.6, 0, 1.0, 0.1), (1.4, -1, 1.0, 0.0)]
    rows = [kinds[i % len(kinds)] for i in range(40)]
    sampling = SamplingTensors.from_lists(*(list(col) for col in zip(*rows)))
    args = (sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p)
    ours = process_static(logits, *args)
    assert torch.allclose(ours, process_logits(logits, *args), atol=1e-6)
    # the sorted path, forced by a top-p that keeps everything on one extra row, gives the same rows
    forced = SamplingTensors.from_lists(*(list(col) for col in zip(*rows, (1.0, 0, 0.999999, 0.0))))
    sorted_rows = process_static(torch.cat([logits, logits[:1]]), forced.temperature, forced.top_k,
                                 forced.top_p, forced.min_p)[:40]
    assert torch.equal(ours, sorted_rows)


def test_cut_keeps_the_prefix_worth_verifying():
    survival = torch.tensor([[0.9, 0.5, 0.2, 0.05], [0.05, 0.01, 0.0, 0.0], [0.99, 0.98, 0.97, 0.96]])
    block = DecodedBlock(tokens=torch.zeros(3, 4, dtype=torch.int64), q=torch.zeros(3, 4, 2),
                         confidence=torch.zeros(3, 4), survival=survival)
    assert block.cut(0.1, [4, 4, 4]) == [3, 1, 4]  # at least one draft, even when S_1 < threshold
    assert block.cut(0.1, [2, 4, 3]) == [2, 1, 3]  # never past the request's budget


def test_decoder_exports_to_onnx_and_onnxruntime_chooses_the_same(tmp_path):
    import onnx

    V, H, K, B = 320, 64, BLOCK, 10
    decoder = random_decoder(V, H, rank=8, seed=3, scale=0.5)
    path = export_onnx(decoder, tmp_path / "decoder.onnx")
    ops = {node.op_type for node in onnx.load(str(path)).graph.node}
    assert not ops & {"If", "Loop", "Scan"}, ops  # straight-line graph: the slot loop stays outside
    g = torch.Generator().manual_seed(4)
    base = torch.randn(B, K, V, generator=g) * 2
    hidden = torch.randn(B, K, H, generator=g)
    roots = torch.randint(0, V, (B,), generator=g)
    sampling = _sampling_rows(B)
    uniforms = torch.rand(B, K, generator=g, dtype=torch.float64)
    with torch.no_grad():
        expected = decode_block(decoder, base, hidden, roots, sampling, uniforms)
    got = decode_block(OnnxDecoder(path, threads=1), base, hidden, roots, sampling, uniforms)
    assert torch.equal(got.tokens, expected.tokens)
    assert torch.allclose(got.q, expected.q, atol=1e-5)
    assert torch.allclose(got.confidence, expected.confidence, atol=1e-6)
    assert torch.allclose(got.survival, expected.survival, atol=1e-6)
    assert got.cut(0.3, [K] * B) == expected.cut(0.3, [K] * B)
    greedy = sampling.temperature == 0
    assert torch.equal(expected.tokens[greedy], expected.q[greedy].argmax(-1))  # greedy rows take the argmax


def test_checkpoint_round_trip(target, tmp_path):
    original = random_dspark(target, cut_threshold=0.25)
    with torch.no_grad():
        original.decoder.markov_out.weight.normal_()
    save_drafter(original, "dspark", original.config, target.config, tmp_path, extra=original.extra_config())
    section = json.loads((tmp_path / "config.json").read_text())["hyspec_drafter"]
    assert section["markov_rank"] == 8 and section["cut_threshold"] == 0.25
    loaded = load_drafter(tmp_path, "dspark", target.config, _build(target), torch.float32)
    for (name, a), b in zip(original.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name
    assert loaded.cut_threshold == 0.25


@pytest.mark.parametrize("batch", [1, 8])
def test_random_drafter_with_a_high_cut_is_identical_to_plain(target, target_dir, plain, tmp_path, batch):
    """Untrained confidence is sigmoid(2) = 0.88 everywhere: S = .88, .77, .68 -> a 0.75 cut keeps 2 of 4 drafts."""
    drafter = random_dspark(target, cut_threshold=0.75)
    save_drafter(drafter, "dspark", drafter.config, target.config, tmp_path, extra=drafter.extra_config())
    count = 3 if batch == 1 else 8
    llm = spec_llm(target_dir, {"method": "dspark", "model": str(tmp_path), "num_speculative_tokens": BLOCK})
    assert generate_in_batches(llm, batch, count) == plain["outputs"][:count]
    t = totals(llm)
    assert 0 < t["draft_tokens"] <= 2 * t["drafts"] and len(t["accepted_per_position"]) <= 2, t
    assert_clean_pool(llm)


@pytest.mark.parametrize("batch", [1, 8])
def test_trained_drafter_is_identical_to_plain_with_long_accepted_chains(target_dir, trained_dir, plain, batch):
    llm = spec_llm(target_dir, {"method": "dspark", "model": str(trained_dir), "num_speculative_tokens": BLOCK})
    assert generate_in_batches(llm, batch) == plain["outputs"]
    t = totals(llm)
    assert t["accepted_tokens"] > 0.7 * t["draft_tokens"], t
    assert t["accepted_per_position"][BLOCK - 1] > 0, t
    assert_clean_pool(llm)


def _toy_dspark(models, peek: bool = False):
    """A toy DSpark drafter for the 16-token toy target: base logits, hidden states, a random decoder, the cut."""
    from tests.test_verify_stats import VOCAB

    g = torch.Generator().manual_seed(21)
    levels = models.target_logits.shape[0]
    base = torch.stack([models.target_logits[(torch.arange(levels) + j).clamp(max=levels - 1)] for j in range(3)],
                       dim=2) + torch.randn(levels, VOCAB, 3, VOCAB, generator=g)
    hidden = torch.randn(levels, VOCAB, 3, 8, generator=g)
    decoder = random_decoder(VOCAB, 8, rank=4, seed=22)
    seen_lengths: set[int] = set()

    def draft(pos, root, sampling, uniforms):
        with torch.no_grad():
            block = decode_block(decoder, base[pos, root], hidden[pos, root], root, sampling, uniforms)
        if peek:  # a broken cut: it looks at the drawn tokens (keeps drafts while q_j(x_j) >= 0.2)
            likely = block.q.gather(2, block.tokens[..., None]).squeeze(-1) >= 0.2
            lengths = likely.long().cumprod(-1).sum(-1).clamp(min=1)
        else:
            lengths = torch.tensor(block.cut(0.3, [3] * pos.numel()))
        seen_lengths.update(lengths.unique().tolist())
        return block.tokens, block.q, lengths

    return draft, seen_lengths


def test_sampled_requests_draft_valid_q_and_are_reproducible(target_dir, trained_dir):
    from hyspec import SamplingParams

    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=11, max_tokens=24, ignore_eos=True)
    llm = spec_llm(target_dir, {"method": "dspark", "model": str(trained_dir), "num_speculative_tokens": BLOCK})
    first = [o.outputs[0].token_ids for o in llm.generate(["def add(a, b):", "x = ["], params)]
    again = [o.outputs[0].token_ids for o in llm.generate(["def add(a, b):", "x = ["], params)]
    assert first == again and all(len(t) == 24 for t in first)
    t = totals(llm)
    assert t["draft_tokens"] > 0 and "draft_unavailable" not in t["rejections"], t  # every q row passed the checks
    assert_clean_pool(llm)


def test_sampled_chains_with_markov_bias_and_cut_emit_the_target_distribution():
    """200,000 sequences through decode_block + the cut + verify, checked as in tests/test_verify_stats.py."""
    from tests.test_verify_stats import PARAMS, ToyModels, failures

    models = ToyModels(seed=31)
    draft, lengths = _toy_dspark(models)
    n = 200_000
    sampling = SamplingTensors.from_lists([PARAMS["temperature"]] * n, [PARAMS["top_k"]] * n,
                                          [PARAMS["top_p"]] * n, [PARAMS["min_p"]] * n)
    samples = decode_chains(models, draft, sampling, seed=32, num_seqs=n, length=3, block=3)
    assert lengths == {1, 2, 3}  # the cut really varied the chain length
    assert failures(samples, models.exact()) == []


def test_a_cut_that_peeks_at_the_drawn_tokens_is_caught():
    """Why the cut may only use S_j (decided before x_j is drawn): peeking at x_j biases the output."""
    from tests.test_verify_stats import PARAMS, ToyModels, failures

    models = ToyModels(seed=31)
    draft, _ = _toy_dspark(models, peek=True)
    n = 50_000
    sampling = SamplingTensors.from_lists([PARAMS["temperature"]] * n, [PARAMS["top_k"]] * n,
                                          [PARAMS["top_p"]] * n, [PARAMS["min_p"]] * n)
    samples = decode_chains(models, draft, sampling, seed=33, num_seqs=n, length=3, block=3)
    assert failures(samples, models.exact())


def test_bad_checkpoints_are_rejected(target, target_dir, tmp_path):
    drafter = random_dspark(target)
    save_drafter(drafter, "dspark", drafter.config, target.config, tmp_path / "good", extra=drafter.extra_config())
    with pytest.raises(CheckpointError, match="not a dflash drafter"):
        spec_llm(target_dir, {"method": "dflash", "model": str(tmp_path / "good")})
    config = json.loads((tmp_path / "good" / "config.json").read_text())
    config["hyspec_drafter"]["markov_rank"] = 16  # tensors are rank 8
    (tmp_path / "good" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="decoder.markov_in.weight.*shape"):
        load_drafter(tmp_path / "good", "dspark", target.config, _build(target), torch.float32)
    cfg = dataclasses.replace(target.config, num_hidden_layers=1, vocab_size=300)
    embed = torch.randn(300, cfg.hidden_size)
    foreign = DSparkDrafter(DFlashConfig(cfg, (0, 1), BLOCK), embed, embed, markov_rank=8)
    save_drafter(foreign, "dspark", foreign.config, cfg, tmp_path / "foreign", extra=foreign.extra_config())
    with pytest.raises(CheckpointError, match="another target: its vocab_size is 300"):
        spec_llm(target_dir, {"method": "dspark", "model": str(tmp_path / "foreign")})
