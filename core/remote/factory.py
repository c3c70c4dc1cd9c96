"""Building a RemoteProposer from a MethodSpec: workers on Ray (or given handles) plus a local fallback.

``hyspec.spec.methods.build_proposer`` calls :func:`build_remote_proposer` for
specs placed remotely (``spec.remote`` set: ``draft_placement: "remote"``).
Local proposers (the fallback, and the drafter each worker hosts) are built
by ``hyspec.drafters.build.build_local`` from a copy of the spec placed
locally, which never routes here, so the routing cannot recurse.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Callable

from hyspec.drafters.build import build_local as build_here
from hyspec.drafters.methods import MethodSpec
from hyspec.errors import ConfigError
from hyspec.remote import cluster
from hyspec.remote.metrics import RemoteMetrics
from hyspec.remote.proposer import RemoteOptions, RemoteProposer
from hyspec.remote.transport import RemoteUnavailable, WorkerHandle
from hyspec.remote.worker import WorkerInit, spawn_ray_workers
from hyspec.seam.proposer import Proposer

if TYPE_CHECKING:
    from hyspec.seam.target import TargetContext

log = logging.getLogger(__name__)

LocalBuilder = Callable[["TargetContext", MethodSpec], Proposer]

# The fallback's prompt lookup when it is ngram for another method (whose config has no prompt_lookup_*).
FALLBACK_LOOKUP = (2, 5)
# vLLM's prompt lookup default, for a remote ngram worker whose spec leaves it unset.
DEFAULT_LOOKUP = 5


def build_remote_proposer(target: "TargetContext", spec: MethodSpec, build_local: LocalBuilder | None = None,
                          options: RemoteOptions | None = None,
                          handles: list[WorkerHandle] | None = None) -> RemoteProposer:
    """The proposer for ``spec`` with ``draft_placement: "remote"``.

    ``build_local(target, spec)`` builds local proposers (default: the
    method's factory, ``hyspec.drafters.build.build_local``); it is given
    specs placed locally.  ``handles`` replaces the Ray workers (e.g.
    in-process hosts).
    An unreachable cluster is not fatal: it is logged, counted
    (``connect_failures``) and every step drafts with the fallback.
    """
    options = options or RemoteOptions()
    build_local = build_local or build_here
    fallback = _build_fallback(target, spec, build_local)
    metrics = RemoteMetrics(spec.method)
    if handles is None:
        handles = _spawn(target, spec, options, metrics)
    return RemoteProposer(target, spec, fallback, handles, options, metrics)


def worker_init(target: "TargetContext", spec: MethodSpec, options: RemoteOptions | None = None) -> WorkerInit:
    """The WorkerInit that builds ``spec``'s drafter on a worker for ``target``."""
    options = options or RemoteOptions()
    return WorkerInit(spec.method, spec.model, spec.num_speculative_tokens,
                      spec.prompt_lookup_min or DEFAULT_LOOKUP, spec.prompt_lookup_max or DEFAULT_LOOKUP,
                      target.vocab_size, target.max_model_len, _placed_locally(spec),
                      options.worker_dtype, options.worker_kv_cache_bytes)


def _spawn(target: "TargetContext", spec: MethodSpec, options: RemoteOptions,
           metrics: RemoteMetrics) -> list[WorkerHandle]:
    address = spec.ray_address
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
                  spec.remote.fallback_method)
        return []


def _placed_locally(spec: MethodSpec) -> MethodSpec:
    return dataclasses.replace(spec, remote=None, ray_address=None)


def _build_fallback(target: "TargetContext", spec: MethodSpec, build_local: LocalBuilder) -> Proposer | None:
    method = spec.remote.fallback_method
    if method == "none":
        return None
    if method == spec.method:
        lookup, model = (spec.prompt_lookup_min, spec.prompt_lookup_max), spec.model
    else:
        lookup, model = FALLBACK_LOOKUP, None
    return build_local(target, dataclasses.replace(_placed_locally(spec), method=method, model=model,
                                                   prompt_lookup_min=lookup[0] or FALLBACK_LOOKUP[0],
                                                   prompt_lookup_max=lookup[1] or FALLBACK_LOOKUP[1]))
