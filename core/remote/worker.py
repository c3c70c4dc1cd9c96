"""The draft worker process: a Ray actor hosting a drafter on a CPU node.

The actor builds the drafter with the ordinary method registry, against a
:class:`~hyspec.seam.target.TargetContext` that holds no target model: the
CPU backend, a private KV pool for the drafter's own cache, and the target's
vocabulary size and context length (the target's vocabulary itself is
compared through a fingerprint at the handshake).  Weights are read from the worker node's disk (the
same path as on the target node, or the embedded default), so a CPU node
needs the drafter files, not the target's.  Prompts are processed here too:
shipping token ids costs 4 bytes a token, shipping a draft model's KV
``2 * layers * kv_heads * head_dim * dtype`` bytes a token (kilobytes), and
the target node would need the drafter's weights -- what remote drafting
exists to free.

Ray is imported only inside :func:`spawn_ray_workers`, so importing this
module costs nothing on a node without Ray.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from hyspec.backends.probe import probe_cpu
from hyspec.drafters.build import build_local, resolve_weights
from hyspec.drafters.methods import get as method_info
from hyspec.model.tokenizer import Tokenizer
from hyspec.remote.transport import RayHandle

log = logging.getLogger(__name__)

#: Custom Ray resource a CPU node advertises to host one draft worker (``hyspec draft-worker``).
WORKER_RESOURCE = "hyspec_draft"
DEFAULT_WORKER_KV_BYTES = 256 << 20
# Each worker actor holds this much of a node's WORKER_RESOURCE (1 per node): room for every method of a hybrid.
WORKER_RESOURCE_SHARE = 0.01
# Threads of the actor's own pool: pings, fault settings and info answer while a draft computes.
ACTOR_CONCURRENCY = 8


@dataclass(frozen=True)
class WorkerInit:
    """What a worker needs to build its drafter (picklable; sent once at actor creation)."""

    method: str
    model: str | None  # drafter weights on the worker node; None = the embedded default
    num_speculative_tokens: int
    prompt_lookup_min: int
    prompt_lookup_max: int
    target_vocab_size: int
    max_model_len: int
    config: Any  # the method's section (hyspec.drafters.methods.MethodSpec), placed locally on the worker
    dtype: str = "float32"  # CPU drafting: fp32 unless the node has fast bf16 (AMX)
    kv_cache_bytes: int = DEFAULT_WORKER_KV_BYTES

    def __post_init__(self) -> None:
        if self.num_speculative_tokens < 1 or self.target_vocab_size < 1 or self.max_model_len < 2:
            raise ValueError("WorkerInit: num_speculative_tokens, target_vocab_size and max_model_len must be positive")
        if self.kv_cache_bytes <= 0:
            raise ValueError(f"WorkerInit.kv_cache_bytes must be positive, got {self.kv_cache_bytes}")


def vocab_fingerprint(tokenizer: Any) -> str:
    """A short hash of token -> id: equal fingerprints mean drafts mean the same thing to both models."""
    items = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(items, separators=(",", ":")).encode()).hexdigest()[:16]


def build_host(init: WorkerInit):
    """Load the drafter described by ``init`` on this process's CPU; return its DraftHost."""
    # these bring torch: at the top they would load it at `hyspec --help` and at every `hyspec draft-worker`
    # start (cli.draft_worker imports this module), measured with cli.main.build_parser: 0.3 s without, 1.8 s with
    from hyspec.backends.registry import backend_for
    from hyspec.kv.pool import KVPool
    from hyspec.model.config import ModelConfig, parse_dtype
    from hyspec.remote.host import DraftHost
    from hyspec.seam.target import TargetContext

    backend = backend_for("cpu", probe_cpu())
    dtype = parse_dtype(init.dtype)
    # One token more than the target asks for: the pipelined step's guess of the bonus token.
    spec = dataclasses.replace(init.config, method=init.method, model=init.model,
                               num_speculative_tokens=init.num_speculative_tokens + 1,
                               prompt_lookup_min=init.prompt_lookup_min, prompt_lookup_max=init.prompt_lookup_max,
                               remote=None, ray_address=None)
    tokenizer, pool = None, None
    model_dir = resolve_weights(method_info(init.method), spec, None)  # a worker has no target checkpoint
    if model_dir is not None:
        tokenizer = Tokenizer(model_dir)
        cfg = ModelConfig.from_pretrained(model_dir)
        page = KVPool.page_bytes_for(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, dtype, 16)
        pool = KVPool.for_budget(init.kv_cache_bytes, page, "cpu")
    # A worker holds no target model: only what a weightless or independent drafter needs.
    # Hypothesis drafts run up to 2k + 1 positions past the committed history.
    target = TargetContext(backend=backend, pool=pool, vocab_size=init.target_vocab_size,
                           max_model_len=init.max_model_len + 2 * init.num_speculative_tokens + 2, dtype=dtype,
                           model_path=None, tokenizer=None)
    proposer = build_local(target, spec)
    fingerprint = vocab_fingerprint(tokenizer) if tokenizer is not None else None
    log.info("draft worker ready: %s from %s", init.method, model_dir)
    return DraftHost(proposer, init.target_vocab_size, fingerprint)


class DraftWorker:
    """The Ray actor body (``ray.remote`` is applied in :func:`spawn_ray_workers`)."""

    def __init__(self, init: WorkerInit):
        self.host = build_host(init)

    def ping(self) -> dict:
        return self.host.stats()

    def info(self) -> dict:
        return self.host.info()

    def draft(self, payload: bytes) -> bytes:
        return self.host.handle(payload)

    def set_fault(self, delay_ms: float = 0.0, garbage: str | None = None) -> None:
        self.host.set_fault(delay_ms, garbage)


def spawn_ray_workers(init: WorkerInit, nodes: list[str | None]) -> list[RayHandle]:
    """Start one draft worker actor per entry of ``nodes`` (a node id, or None for anywhere).

    Actors are pinned softly to their node and hold a sliver of
    ``WORKER_RESOURCE`` (so every method of a hybrid gets a worker on every
    draft node, and a restarted actor lands on a draft node, never on the
    target's).  They reserve no logical CPUs: the cores a worker uses are
    set by the thread scheduler, not by Ray's accounting.  Actors restart
    without limit when their process dies; the target notices the new
    incarnation and resends histories.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    actor_cls = ray.remote(DraftWorker)
    handles = []
    for i, node in enumerate(nodes):
        options = {"num_cpus": 0, "max_restarts": -1, "max_task_retries": 0, "max_concurrency": ACTOR_CONCURRENCY}
        if node is not None:
            options["resources"] = {WORKER_RESOURCE: WORKER_RESOURCE_SHARE}
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=True)
        actor = actor_cls.options(**options).remote(init)
        handles.append(RayHandle(actor, f"ray-{init.method}-{i}"))
    return handles
