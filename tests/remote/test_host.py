"""The worker side in-process: shadow histories, resync, pipelining, warm-up, faults, threads."""
from __future__ import annotations

import time

import pytest
import torch

from hyspec.drafters.ngram.proposer import NgramProposer
from hyspec.remote.host import DraftHost, Fault
from hyspec.remote.protocol import (DraftCall, ProtocolError, SamplingSpec, SeqUpdate, decode_reply, draft_to_tree,
                                    encode_call)
from hyspec.remote.wire import WireError
from hyspec.seam.proposer import Proposer

V = 320
GREEDY = SamplingSpec(0.0)
LOOP = [11, 12, 13, 14] * 3 + [11, 12]  # ngram continues a loop: after "11 12" comes "13 14 11 ..."


def ngram_host(k: int = 3) -> DraftHost:
    return DraftHost(NgramProposer(1, 3, k + 1, V), V)  # k + 1: room for the pipelined bonus guess


def call(host: DraftHost, updates, call_id=1, pipelining=False, releases=(), threads=None):
    data = host.handle(encode_call(DraftCall(call_id, list(updates), list(releases), pipelining, threads)))
    reply, raws = decode_reply(data)
    return reply, raws


def register(rid="r", tokens=LOOP, budget=3, sampling=GREEDY, seed=None):
    return SeqUpdate(rid, 0, list(tokens), budget, sampling, seed)


def test_draft_for_a_new_sequence_then_incremental_updates():
    host = ngram_host()
    _, raws = call(host, [register()])
    d = raws["r"]
    assert (d.status, d.hist_len, d.tokens.tolist()) == ("ok", len(LOOP), [13, 14, 11])
    _, raws = call(host, [SeqUpdate("r", len(LOOP), [13, 14], 3)], call_id=2)
    assert raws["r"].hist_len == len(LOOP) + 2 and raws["r"].tokens.tolist() == [11, 12, 13]


def test_gap_unknown_sequence_and_rewritten_history_ask_for_resync():
    host = ngram_host()
    _, raws = call(host, [SeqUpdate("new", 4, [1, 2], 3)])  # never registered
    assert raws["new"].status == "resync"
    call(host, [register()])
    _, raws = call(host, [SeqUpdate("r", len(LOOP) + 5, [1], 3)])  # a lost message leaves a gap
    assert raws["r"].status == "resync" and raws["r"].hist_len == len(LOOP)
    _, raws = call(host, [SeqUpdate("r", 2, [99, 98], 3)])  # contradicts the history: the shadow is dropped
    assert raws["r"].status == "resync"
    _, raws = call(host, [register(tokens=[5, 6, 5, 6, 5])])  # a full resend rebuilds it
    assert raws["r"].status == "ok" and raws["r"].tokens.tolist() == [6, 5]


def test_repeated_update_is_idempotent():
    host = ngram_host()
    call(host, [register()])
    upd = SeqUpdate("r", len(LOOP), [13], 3)
    call(host, [upd])
    _, raws = call(host, [upd])  # delivered twice (a retry): nothing appended twice
    assert raws["r"].hist_len == len(LOOP) + 1


def test_pipelined_hit_when_everything_is_accepted_and_miss_otherwise():
    host = ngram_host()
    _, raws = call(host, [register()], pipelining=True)
    assert raws["r"].tokens.tolist() == [13, 14, 11]
    host.drain()  # the speculative draft for "all accepted + guessed bonus 12" has run
    reply, raws = call(host, [SeqUpdate("r", len(LOOP), [13, 14, 11, 12], 3)], call_id=2, pipelining=True)
    assert raws["r"].pipelined and raws["r"].tokens.tolist() == [13, 14, 11]
    assert (reply.spec_hits, reply.spec_misses) == (1, 0)
    host.drain()
    # only one draft accepted, the target's bonus differs: the speculative work is discarded
    reply, raws = call(host, [SeqUpdate("r", len(LOOP) + 4, [13, 99], 3)], call_id=3, pipelining=True)
    assert not raws["r"].pipelined and reply.spec_misses == 1
    assert raws["r"].hist_len == len(LOOP) + 6


def test_speculation_yields_to_a_waiting_call():
    host = ngram_host()
    call(host, [register()])
    host.drain()
    host._waiting_real = 1  # a real call is queued behind the speculative job
    host._speculate([(host._shadows["r"], [13, 14, 11], 3)])
    assert host.spec_skipped == 1 and "r" not in host._spec


def test_warm_up_registers_without_drafting_and_release_forgets():
    host = ngram_host()
    _, raws = call(host, [SeqUpdate("w", 0, LOOP, 0, GREEDY)])
    assert raws["w"].status == "none" and len(raws["w"].tokens) == 0
    host.drain()
    assert "w" in host.proposer._arrays  # the prompt was processed in the background
    call(host, [], releases=["w"])
    assert "w" not in host._shadows and "w" not in host.proposer._arrays


def test_least_recently_used_sequences_are_dropped_at_the_cap():
    host = DraftHost(NgramProposer(1, 3, 4, V), V, max_sequences=2)
    for rid in "abc":
        call(host, [register(rid)])
    assert list(host._shadows) == ["b", "c"]


def test_a_failing_drafter_answers_error():
    class Broken(Proposer):
        method = "broken"

        def propose(self, requests, sampling):
            raise RuntimeError("boom")

    host = DraftHost(Broken(), V)
    _, raws = call(host, [register()])
    assert raws["r"].status == "error"


def test_thread_count_is_applied_on_the_compute_thread():
    host = ngram_host()
    call(host, [register()], threads=1)
    assert host._compute.submit(torch.get_num_threads).result() == 1
    call(host, [SeqUpdate("r", len(LOOP), [13], 3)], threads=99)  # clamped to the node
    assert host.threads == host.cores
    stats = host.stats()
    assert stats["threads"] == host.cores and 0.0 <= stats["cpu_util"] <= 1.0 and stats["calls"] == 2


@pytest.mark.parametrize("kind", ["lengths", "ids", "stale", "nan"])
def test_injected_garbage_is_caught_by_the_target_checks(kind):
    host = ngram_host()
    host.set_fault(garbage=kind)
    sampled = kind == "nan"  # q is only read for sampled requests
    _, raws = call(host, [register(sampling=SamplingSpec(0.8) if sampled else GREEDY)])
    with pytest.raises(ProtocolError):
        draft_to_tree(raws["r"], LOOP[-1], len(LOOP), 3, greedy=not sampled, vocab=V)


def test_garbage_bytes_and_delay():
    host = ngram_host()
    host.set_fault(garbage="bytes")
    with pytest.raises(WireError):
        decode_reply(host.handle(encode_call(DraftCall(1, [register()]))))
    host.set_fault(delay_ms=80)
    t = time.perf_counter()
    call(host, [SeqUpdate("r", len(LOOP), [13], 3)])
    assert time.perf_counter() - t >= 0.08
    with pytest.raises(ValueError):
        Fault(garbage="poison")


@pytest.fixture(scope="module")
def draft_model_host(target_dir, draft_dir):
    from hyspec.remote.worker import WorkerInit, build_host
    from hyspec.spec.config import SpeculativeConfig
    from hyspec.spec.methods import method_specs

    cfg = SpeculativeConfig.from_dict({"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": 3})
    return lambda: build_host(WorkerInit("draft_model", str(draft_dir), 3, 5, 5, V, 256, method_specs(cfg)[0]))


def test_sampled_drafts_carry_valid_q_and_are_reproducible_with_a_seed(draft_model_host):
    spec = SamplingSpec(0.9, top_k=20)
    drafts = []
    for _ in range(2):
        host = draft_model_host()
        assert host.fingerprint and host.info()["method"] == "draft_model"
        _, raws = call(host, [register(sampling=spec, seed=1234)])
        tree = draft_to_tree(raws["r"], LOOP[-1], len(LOOP), 3, greedy=False, vocab=V, trust_q=True)
        assert tree.draft_probs.shape == (4, V)
        assert int((tree.draft_probs[1:] > 0).sum(1).max()) <= 20  # top-k processed, like the target's p
        drafts.append(tree.tokens.tolist())
        host.close()
    assert drafts[0] == drafts[1]


def test_no_q_on_the_wire_unless_the_target_asks(draft_model_host):
    """A target that verifies point proposals (remote.trust_worker_q false) sends send_q=False: q stays home."""
    host = draft_model_host()
    try:
        ask = DraftCall(1, [register(sampling=SamplingSpec(0.9), seed=1)], send_q=False)
        _, raws = decode_reply(host.handle(encode_call(ask)))
        assert raws["r"].status == "ok" and raws["r"].q_head is None and not raws["r"].q_arrays
    finally:
        host.close()
