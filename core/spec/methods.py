"""From ``speculative_config`` to proposers: each method's own section, then its factory.

:func:`method_specs` cuts the config into one :class:`MethodSpec` per method
to load (the method's keys, its tree or suffix section, its placement);
:func:`build_proposer` resolves the weights and calls the method's factory
from the table (``hyspec.drafters.methods``), or, for a remote placement,
builds the RemoteProposer whose workers and fallback build the same way.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from hyspec.assets import assets_dir
from hyspec.drafters.build import build_local, resolve_weights
from hyspec.drafters.methods import MethodSpec, SuffixOptions, TreeShape, default_hybrid_methods, drafter_dirs
from hyspec.remote.factory import build_remote_proposer
from hyspec.seam.proposer import Proposer
from hyspec.spec.config import SpeculativeConfig

if TYPE_CHECKING:
    from hyspec.seam.target import TargetContext

log = logging.getLogger(__name__)

# vLLM's prompt lookup when neither bound is given; and what a bare hybrid's ngram matches
DEFAULT_LOOKUP = 5
HYBRID_LOOKUP = (1, 3)


def method_spec(cfg: SpeculativeConfig, method: str, model: str | None, num_speculative_tokens: int,
                prompt_lookup_min: int | None = None, prompt_lookup_max: int | None = None) -> MethodSpec:
    """``method``'s section of ``cfg``: its own keys plus the tree, suffix and placement sections it reads."""
    tree = cfg.tree
    return MethodSpec(
        method, model, num_speculative_tokens, prompt_lookup_min, prompt_lookup_max,
        tree=TreeShape(tree.budget, tree.depth, tree.topk),
        speculative_token_tree=cfg.speculative_token_tree,
        suffix=SuffixOptions(cfg.suffix_decoding_max_tree_depth, cfg.suffix_decoding_max_cached_requests,
                             cfg.suffix_decoding_max_spec_factor, cfg.suffix_decoding_min_token_prob,
                             cfg.suffix_decoding_corpus),
        remote=cfg.remote if cfg.draft_placement == "remote" else None,
        ray_address=cfg.ray_address)


def method_specs(cfg: SpeculativeConfig) -> list[MethodSpec]:
    """One spec per method the config loads: its method, the hybrid's list, or a bare hybrid's defaults."""
    top_k = cfg.num_speculative_tokens
    if cfg.method != "hybrid":
        return [method_spec(cfg, cfg.method, cfg.model, top_k, cfg.prompt_lookup_min, cfg.prompt_lookup_max)]
    if not cfg.hybrid.methods:
        return default_hybrid_specs(cfg)
    specs = []
    for m in cfg.hybrid.methods:
        lookup_min = m.prompt_lookup_min or m.prompt_lookup_max or DEFAULT_LOOKUP  # vLLM's rule: one given -> both
        lookup_max = m.prompt_lookup_max or m.prompt_lookup_min or DEFAULT_LOOKUP
        specs.append(method_spec(cfg, m.method, m.model, m.num_speculative_tokens or top_k, lookup_min, lookup_max))
    return specs


def default_hybrid_specs(cfg: SpeculativeConfig) -> list[MethodSpec]:
    """A bare {"method": "hybrid"}: ngram and suffix (no weights) plus the table's default methods whose
    embedded drafter exists.  Suffix drafts up to the top-level ceiling (its drafts size themselves); the
    others up to the tree depth, which is DEFAULT_NUM_SPECULATIVE_TOKENS unless num_speculative_tokens or
    tree.depth was given (config.py resolves both)."""
    k = min(cfg.num_speculative_tokens, cfg.tree.depth)
    specs = [method_spec(cfg, "ngram", None, k, *HYBRID_LOOKUP),
             method_spec(cfg, "suffix", None, cfg.num_speculative_tokens, *HYBRID_LOOKUP)]
    dirs = drafter_dirs()
    for method in default_hybrid_methods():
        if (assets_dir() / dirs[method] / "config.json").is_file():
            specs.append(method_spec(cfg, method, None, k, *HYBRID_LOOKUP))
    log.info("hybrid with no methods listed: loading %s", [s.method for s in specs])
    return specs


def build_proposer(target: "TargetContext", spec: MethodSpec) -> Proposer:
    """``spec.method``'s proposer from its factory; a remote placement wraps workers and a local fallback in a
    RemoteProposer (both built by ``build_local``, so the routing cannot recurse)."""
    if spec.remote is not None:
        return build_remote_proposer(target, spec, build_local)
    return build_local(target, spec)


__all__ = ["MethodSpec", "build_local", "build_proposer", "default_hybrid_specs", "method_spec", "method_specs",
           "resolve_weights"]
