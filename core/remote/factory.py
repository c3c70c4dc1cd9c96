"""Building a RemoteProposer from a MethodSpec: workers on Ray (or given handles) plus a local fallback.

The method registry calls :func:`build_remote_proposer` for specs whose
config says ``draft_placement: "remote"``.  Local proposers (the fallback,
and the drafter each worker hosts) are built through the same registry with
a copy of the config whose placement is ``"local"``, so the registry's
routing cannot recurse.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Callable

from hyspec.errors import ConfigError
from hyspec.remote.metrics import RemoteMetrics
from hyspec.remote.proposer import RemoteOptions, RemoteProposer
from hyspec.remote.transport import RemoteUnavailable, WorkerHandle
from hyspec.spec.proposer import Proposer

if TYPE_CHECKING:
    from hyspec.engine.target import TargetContext
    from hyspec.remote.worker import WorkerInit
    from hyspec.spec.methods import MethodSpec

log = logging.getLogger(__name__)

LocalBuilder = Callable[["TargetContext", "MethodSpec"], Proposer]

# The fallback's prompt lookup when it is ngram for another method (whose config has no prompt_lookup_*).
FALLBACK_LOOKUP = (2, 5)
# vLLM's prompt lookup default, for a remote ngram worker whose spec leaves it unset.
DEFAULT_LOOKUP = 5


def build_remote_proposer(target: "TargetContext", spec: "MethodSpec", build_local: LocalBuilder | None = None,
                          options: RemoteOptions | None = None,
                          handles: list[WorkerHandle] | None = None) -> RemoteProposer:
    """The proposer for ``spec`` with ``draft_placement: "remote"``.

    ``build_local(target, spec)`` builds local proposers (default: the method
    registry); it is given specs whose config says ``draft_placement:
    "local"``, so a registry that routes remote placements here does not
    recurse.  ``handles`` replaces the Ray workers (e.g. in-process hosts).
    An unreachable cluster is not fatal: it is logged, counted
    (``connect_failures``) and every step drafts with the fallback.
    """
    from hyspec.spec.methods import build_proposer

    options = options or RemoteOptions()
    build_local = build_local or build_proposer
    fallback = _build_fallback(target, spec, build_local)
    metrics = RemoteMetrics(spec.method)
    if handles is None:
        handles = _spawn(target, spec, options, metrics)
    return RemoteProposer(target, spec, fallback, handles, options, metrics)


def worker_init(target: "TargetContext", spec: "MethodSpec", options: RemoteOptions | None = None) -> "WorkerInit":
    """The WorkerInit that builds ``spec``'s drafter on a worker for ``target``."""
    from hyspec.remote.worker import WorkerInit

    options = options or RemoteOptions()
    return WorkerInit(spec.method, spec.model, spec.num_speculative_tokens,
                      spec.prompt_lookup_min or DEFAULT_LOOKUP, spec.prompt_lookup_max or DEFAULT_LOOKUP,
                      target.vocab_size, target.max_model_len, _local_config(spec.config),
                      options.worker_dtype, options.worker_kv_cache_bytes)


def _spawn(target: "TargetContext", spec: "MethodSpec", options: RemoteOptions,
           metrics: RemoteMetrics) -> list[WorkerHandle]:
    from hyspec.remote import cluster
    from hyspec.remote.worker import spawn_ray_workers

    address = spec.config.ray_address
    try:
        cluster.connect(address)
        nodes = cluster.worker_nodes(address)
        if options.num_workers is not None:  # more workers than nodes: several per node
            nodes = [nodes[i % len(nodes)] for i in range(options.num_workers)]
        return spawn_ray_workers(worker_init(target, spec, options), nodes)
    except ConfigError:
        raise
    except Exception as exc:  # RemoteUnavailable, or Ray failing to start
        metrics.add("connect_failures")
        why = exc if isinstance(exc, RemoteUnavailable) else f"{type(exc).__name__}: {exc}"
        log.error("remote drafting is unavailable (%s); drafting locally with %s", why,
                  spec.config.remote.fallback_method)
        return []


def _local_config(cfg: Any) -> Any:
    return dataclasses.replace(cfg, draft_placement="local", ray_address=None)


def _build_fallback(target: "TargetContext", spec: "MethodSpec", build_local: LocalBuilder) -> Proposer | None:
    from hyspec.spec.methods import MethodSpec

    local_cfg = _local_config(spec.config)
    method = local_cfg.remote.fallback_method
    if method == "none":
        return None
    if method == spec.method:
        lookup, model = (spec.prompt_lookup_min, spec.prompt_lookup_max), spec.model
    else:
        lookup, model = FALLBACK_LOOKUP, None
    return build_local(target, MethodSpec(method, model, spec.num_speculative_tokens, lookup[0] or FALLBACK_LOOKUP[0],
                                          lookup[1] or FALLBACK_LOOKUP[1], local_cfg))
