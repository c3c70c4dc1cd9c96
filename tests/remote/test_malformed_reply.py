"""One worker's malformed reply costs that worker's drafts only: counted invalid, warned once, no traceback."""
from __future__ import annotations

import json
import logging
import struct
from concurrent.futures import Future

import pytest

from hyspec import LLM, SamplingParams
from hyspec.remote.transport import FuturePending
from hyspec.remote.wire import MAGIC
from tests.remote.conftest import PROMPTS, inprocess_handles, remote_placement, spec_config, token_ids

SHORT = 16
GREEDY = SamplingParams(temperature=0, max_tokens=SHORT)


def framed(header: dict) -> bytes:
    head = json.dumps(header).encode()
    return MAGIC + struct.pack("<I", len(head)) + head


# Replies that once escaped the per-worker handling (OverflowError, RecursionError, TypeError, ValueError).
MALFORMED = {
    "huge-shape": framed({"arrays": [["int32", [2**64]]]}),
    "deep-nesting": MAGIC + struct.pack("<I", 200_002) + b"[" * 100_001 + b"]" * 100_001,
    "infinite-call-id": framed({"call_id": 1e999, "incarnation": "x", "drafts": [], "worker_seconds": 0,
                                "spec_hits": 0, "spec_misses": 0, "arrays": []}),
}


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_malformed_reply_spares_the_other_workers_drafts(target_dir, draft_dir, plain_outputs, caplog, kind):
    with remote_placement(inprocess_handles(count=2)):
        llm = LLM(str(target_dir), dtype="float32", kv_cache_bytes=8 << 20,
                  speculative_config=spec_config(model=draft_dir, remote={"draft_deadline_ms": 5000}))
    rp = llm.engine.spec.proposers["draft_model"]
    try:
        bad, good = rp.slots
        garbage, bad_calls = Future(), []
        garbage.set_result(MALFORMED[kind])
        bad.handle.draft = lambda payload: bad_calls.append(payload) or FuturePending(garbage)
        caplog.set_level(logging.WARNING)
        assert token_ids(llm.generate(PROMPTS[:2], GREEDY)) == [p[:SHORT] for p in plain_outputs[:2]]
        snap = rp.metrics.snapshot()
        assert snap["invalid_drafts"].get("bytes", 0) > 0, snap["invalid_drafts"]
        assert snap["drafts"]["remote"] + snap["drafts"]["pipelined"] > 0  # the good worker's drafts were used
        assert bad_calls and good.handle.host.calls > 0  # both workers had sequences
        rejections = llm.engine.spec.metrics.snapshot()["totals"]["rejections"]
        assert rejections.get("draft_unavailable", 0) == 0, rejections
        tracebacks = [r.getMessage() for r in caplog.records if r.exc_info]
        assert not tracebacks, tracebacks
        warned = [r for r in caplog.records if "unusable answer" in r.getMessage()]
        assert len(warned) == 1  # once per problem and worker; repeats go to debug
    finally:
        rp.close()
