"""``speculative_config``: vLLM's JSON shape plus hyspec's keys, validated on construction.

    cfg = SpeculativeConfig.from_json('{"method": "ngram", "num_speculative_tokens": 4}')
    cfg = SpeculativeConfig.from_dict({"method": "eagle", "tree": {"budget": 48}})

The vLLM keys keep vLLM's names and meaning (``method``, ``model``,
``num_speculative_tokens``, ``prompt_lookup_min/max``, ...), so a config
written for vLLM works unchanged when it uses only features hyspec has.  Keys
vLLM knows but hyspec does not implement are rejected as "not supported by
hyspec" rather than silently ignored; unknown keys are rejected with the
closest valid name.  Every error names the full dotted key.

The sections are pydantic dataclasses: types and bounds are declared on each
key (``hyspec.spec._config_check``); ``__post_init__`` holds only the rules
that relate keys to each other and the defaults that depend on other keys.
``SpeculativeConfig.describe()`` renders the key reference as Markdown and
``SpeculativeConfig.json_schema()`` the JSON Schema.
"""
from __future__ import annotations

import ast
import dataclasses
import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Optional

from pydantic import BeforeValidator, WithJsonSchema

from hyspec.drafters.methods import MAX_TREE_BUDGET
from hyspec.errors import ConfigError
from hyspec.policy.load import LOAD_SIGNALS
from hyspec.spec import _config_check as chk
from hyspec.spec import registry
from hyspec.spec._config_check import ROOT, Bool, Float, Int, Text, key, section, section_field
from hyspec.spec.ops_config import MemoryPressureConfig, MemoryPressureSection, SLOConfig, SLOSection
from hyspec.spec.registry import UNSUPPORTED_METHODS

MAX_SPECULATIVE_TOKENS = 64
DEFAULT_NUM_SPECULATIVE_TOKENS = 4
# vLLM's ngram default when neither bound is given ("arbitrarily chosen" upstream).
DEFAULT_PROMPT_LOOKUP = 5
PLACEMENTS = ("local", "remote")
# hyspec.model.quantize_drafter.DRAFTER_QUANTIZATION_CHOICES (that module imports torch; the config must not)
QUANTIZATION = ("none", "int8", "int4")

# vLLM SpeculativeConfig fields hyspec does not implement (vLLM's name -> why / what instead).
VLLM_UNSUPPORTED_KEYS = {
    "enforce_eager": "graph capture is the engine's switch, not the drafter's: LLM(enforce_eager=...) / --enforce-eager",
    "tensor_parallel_size": "vLLM itself rejects this name; drafters run on one device",
    "moe_backend": "MoE drafters are not implemented",
    "attention_backend": "the backend is chosen once by the capability probe (--backend)",
    "kv_cache_dtype": "draft and target share one KV block pool and its dtype",
    "revision": "models load from local paths only (no downloads at run time)",
    "code_revision": "models load from local paths only (no downloads at run time)",
    "index_share_for_mtp_iteration": "sparse-attention MTP modules are not implemented",
    "disable_padded_drafter_batch": "hyspec manages drafter batch layout itself",
    "disable_eagle_block_drop": "hyspec has no prefix-cache block dropping to disable",
    "use_local_argmax_reduction": "no vocabulary-parallel lm_head",
    "use_heterogeneous_vocab": "draft and target must share the vocabulary (losslessness)",
    "parallel_drafting": "use method 'dflash' or 'dspark' for parallel drafting",
    "num_speculative_tokens_per_batch_size": "the goodput controller sets the draft length per step",
    "draft_load_config": "models load from local paths only (no downloads at run time)",
    "rejection_sample_method": "hyspec always uses lossless rejection sampling",
    "synthetic_acceptance_rates": "no synthetic acceptance mode",
    "synthetic_acceptance_length": "no synthetic acceptance mode",
    "enable_adaptive_verification": "the goodput controller adapts the budget for every method",
    "draft_sample_method": "draft probabilities are always the ones sampled from",
    "dspark_draft_topk": "not implemented for hyspec's DSpark decoder",
    "disable_logprobs": "a vLLM v0 option with no hyspec equivalent",
    "disable_log_stats": "metrics are always collected (Prometheus /metrics)",
    "acceptance_method": "vLLM v0 option; hyspec always uses lossless rejection sampling",
}


@section(f"{ROOT}.tree")
class TreeConfig:
    """Draft-tree shape for tree-drafting methods (EAGLE-2-style dynamic trees).

    The budget default 32 is a serving default, not EAGLE-2's single-request 60:
    at batch 8 a 32-node tree already verifies 264 tokens per step, around where
    a mid-size accelerator stops being memory-bound.  The goodput controller
    shrinks the budget further whenever verification gets expensive.
    """

    budget: Optional[Int] = key(None, "Total draft nodes per sequence and step (1..256); null = 32, "
                                      "or the node count of `speculative_token_tree`.", ge=1, le=MAX_TREE_BUDGET)
    depth: Optional[Int] = key(None, "Deepest draft level; null = `num_speculative_tokens` "
                                     "(or the static tree's depth). Must be <= budget.", ge=1, le=MAX_TREE_BUDGET)
    topk: Optional[Int] = key(None, "Children expanded per node (EAGLE-2 top-k); null = 8 "
                                    "(or the static tree's widest branching). Must be <= budget.",
                              ge=1, le=MAX_TREE_BUDGET)

    def __post_init__(self) -> None:
        if self.budget is not None:
            for name in ("depth", "topk"):
                value = getattr(self, name)
                if value is not None and value > self.budget:
                    chk.invalid(name, f"{value} exceeds tree.budget {self.budget}")


TreeSection = section_field(TreeConfig)


@section(f"{ROOT}.controller")
class ControllerConfig:
    """The goodput controller: picks the draft length / tree budget each step (controller.py)."""

    enabled: Bool = key(True, "Adapt the draft length per step; false = always draft `max_draft_tokens`.")
    ewma_alpha: Float = key(0.05, "Weight of the newest step in the per-position acceptance EWMA, in (0, 1].",
                            gt=0.0, le=1.0)
    min_draft_tokens: Int = key(0, "Floor on the draft length when speculating (operators often set 2); "
                                   "never forces speculation the cost model rejects.", ge=0, le=MAX_SPECULATIVE_TOKENS)
    max_draft_tokens: Optional[Int] = key(None, "Ceiling on the draft length; null = `num_speculative_tokens`.",
                                          ge=1, le=MAX_SPECULATIVE_TOKENS)
    profile_at_startup: Bool = key(True, "Time target steps on a small (batch, tokens) grid at start-up "
                                         "to fit the cost model; false = learn it online only.")
    acceptance_prior: Float = key(0.9, "Optimistic initial per-position acceptance, so a new method is tried.",
                                  ge=0.0, le=1.0)
    explore_interval: Int = key(256, "After this many consecutive plain steps of a method, draft once to "
                                     "refresh its acceptance estimate; 0 = never.", ge=0)
    min_gain: Float = key(0.02, "Relative goodput gain over plain decoding required to speculate.", ge=0.0, le=10.0)
    wave_makespan: Bool = key(True, "In a batch admitted together that nothing waits to join (a wave), only rows "
                                    "that could still finish last may draft: drafts of rows ahead cannot shorten "
                                    "it (policy/wave.py).")

    def __post_init__(self) -> None:
        if self.max_draft_tokens is not None and self.min_draft_tokens > self.max_draft_tokens:
            chk.invalid("min_draft_tokens",
                        f"{self.min_draft_tokens} exceeds controller.max_draft_tokens {self.max_draft_tokens}")


ControllerSection = section_field(ControllerConfig)


@section(f"{ROOT}.quality")
class QualityConfig:
    """The draft-quality monitor (quality.py): warns when a method drafts badly or erratically."""

    min_acceptance: Float = key(0.6, "Warn when a method's EWMA acceptance stays below this for `window` steps.",
                                ge=0.0, le=1.0)
    # per-step acceptance lies in [0, 1], so its standard deviation is at most 0.5
    max_std: Float = key(0.15, "Warn when the std of per-step acceptance over `window` steps exceeds this.",
                         ge=0.0, le=0.5)
    window: Int = key(100, "Steps per judgement (2..100000).", ge=2, le=100_000)


QualitySection = section_field(QualityConfig)


@section(f"{ROOT}.remote")
class RemoteConfig:
    """Remote drafting on Ray CPU workers (used when `draft_placement` is "remote")."""

    ping_interval_ms: Int = key(200, "Health ping period per worker, in ms.", ge=1, le=60_000)
    max_missed_pings: Int = key(3, "Missed pings before a worker's sequences fail over to local drafting.",
                                ge=1, le=1000)
    draft_deadline_ms: Int = key(50, "A draft later than this makes the step a plain step (`draft_timeout`); "
                                     "above a LAN round trip plus a CPU draft, far below a 320 ms stall.",
                                 ge=1, le=60_000)
    busy_threshold: Float = key(0.95, "Target busy fraction above which worker threads are cut back, in (0, 1].",
                                gt=0.0, le=1.0)
    min_cores: Int = key(4, "Floor on each worker's thread count (a 2-core cap starved drafters in the field).",
                         ge=1, le=4096)
    pipelining: Bool = key(True, "Draft step t+1 while the target verifies step t.")
    fallback_method: str = key("ngram", "Local method used after failover, or \"none\" for plain decoding.")
    trust_worker_q: Bool = key(False, "Verify sampled drafts with the q each worker reports (its workers and the "
                                      "link to them are trusted). false: point proposals, lossless whatever a "
                                      "worker sends, at some acceptance (docs/architecture.md, remote drafting).")

    def __post_init__(self) -> None:
        chk.one_of("fallback_method", self.fallback_method, [*registry.proposer_methods(), registry.NONE])


RemoteSection = section_field(RemoteConfig)


def _method_shorthand(value: Any) -> Any:
    return {"method": value} if isinstance(value, str) else value


@section(f"{ROOT}.hybrid.methods[]")
class MethodConfig:
    """One method the hybrid dispatcher may choose (an item of `hybrid.methods`).

    A bare string is shorthand for `{"method": name}`.
    """

    method: str = key(dataclasses.MISSING, "A method other than hybrid.")
    model: Optional[Text] = key(None, "Draft weights (path); null = the embedded default drafter.")
    num_speculative_tokens: Optional[Int] = key(None, "Draft length ceiling for this method, at most the "
                                                      "top-level value; null = the top-level value.",
                                                ge=1, le=MAX_SPECULATIVE_TOKENS)
    prompt_lookup_min: Optional[Int] = key(None, "ngram only; as the top-level key.", ge=1)
    prompt_lookup_max: Optional[Int] = key(None, "ngram only; as the top-level key.", ge=1)

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", _canonical_method(self.method))
        if self.method == registry.HYBRID:
            chk.invalid("method", f"a hybrid cannot contain another {self.method}")
        _check_model_allowed(self)
        _resolve_prompt_lookup(self)


HybridMethod = Annotated[MethodConfig, BeforeValidator(_method_shorthand)]
LoadSignal = Literal[LOAD_SIGNALS]


@section(f"{ROOT}.hybrid")
class HybridConfig:
    """The hybrid dispatcher: method choice per step, load-based fallback, canary rollout."""

    rules_path: Optional[Text] = key(None, "JSON rules file (watched, hot-reloaded); null = the built-in rules under "
                                           "policy \"rules\" (with policy null, no rules file means the bandit).")
    methods: tuple[HybridMethod, ...] = key((), "Methods to load (list of method configs or names); "
                                                "empty = ngram, suffix and every embedded default drafter "
                                                "present.")
    load_threshold: Float = key(0.75, "Load above which speculation turns off for new steps, in (0, 1].",
                                gt=0.0, le=1.0)
    load_resume_threshold: Float = key(0.6, "Load below which it turns back on (hysteresis); < load_threshold.",
                                       ge=0.0, le=1.0)
    load_signal: LoadSignal = key("max", f"{' | '.join(LOAD_SIGNALS)}: load is the engine's own figure (running / "
                                         "max_num_seqs); max the largest of them (any saturated resource makes "
                                         "drafting a loss).")
    speculative_fraction: Float = key(1.0, "Share of requests (stable hash) that speculate: the canary arm.",
                                      ge=0.0, le=1.0)
    policy: Optional[Literal["rules", "bandit"]] = key(
        None, "null = bandit without rules_path, rules with one. rules: steps no rule "
              "matches decode plainly; bandit: they (and rules with "
              "\"policy\": \"bandit\") go to a bandit over the loaded methods and none, learnt "
              "per class of step from measured goodput (without rules_path: no rules at all).")
    bandit_explore_fraction: Float = key(0.1, "bandit: the largest share of a class's steps, and of its measured "
                                              "time, spent trying other arms, in (0, 0.5]. A speculative step at a "
                                              "large batch can cost several plain steps, so bounding the time too "
                                              "keeps exploration cheap.", gt=0.0, le=0.5)
    bandit_warmup: Int = key(2, "bandit: trials of every arm in a class before it exploits (1..1000).", ge=1, le=1000)
    bandit_discount: Float = key(0.99, "bandit: weight kept by an arm's older goodput per new measurement, (0, 1].",
                                 gt=0.0, le=1.0)
    bandit_plain_margin: Float = key(0.05, "bandit: at batch sizes above 1, how much more goodput than plain "
                                           "decoding a method must show before it is chosen over it, a fraction "
                                           "in [0, 0.5]. Means within a few per cent are noise, and plain "
                                           "decoding then costs nothing if the estimate was wrong; at batch 1 "
                                           "verification is nearly free and no margin applies.", ge=0.0, le=0.5)
    bandit_max_backoff: Int = key(64, "bandit: an arm whose exploring step fell clearly behind the best waits "
                                      "twice as long for its next, up to this many exploration intervals "
                                      "(1..4096; 1 = every other arm in turn, no back-off).", ge=1, le=4096)

    def __post_init__(self) -> None:
        if self.policy is None:
            # the built-in rules were written for the toy target's drafters; on the real default model only
            # suffix decoding paid, so a bare hybrid learns what pays (docs/results/2026-12-05/hybrid-backoff)
            object.__setattr__(self, "policy", "bandit" if self.rules_path is None else "rules")
        if self.load_resume_threshold >= self.load_threshold:
            chk.invalid("load_resume_threshold", f"{self.load_resume_threshold} must be below "
                                                 f"hybrid.load_threshold {self.load_threshold} (hysteresis)")
        seen: dict[str, int] = {}
        for i, m in enumerate(self.methods):
            if m.method in seen:
                chk.invalid(f"methods[{i}].method", f"{m.method!r} is already listed at methods[{seen[m.method]}]")
            seen[m.method] = i


HybridSection = section_field(HybridConfig)


# a JSON list of node paths, or vLLM's string form of one; parse_token_tree checks it
TokenTree = Annotated[Any, WithJsonSchema({"anyOf": [
    {"type": "string"}, {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0}}},
    {"type": "null"}]})]


@section(ROOT)
class SpeculativeConfig:
    """The whole ``speculative_config``: vLLM's keys, then hyspec's sections.

    Construct with ``from_dict`` / ``from_json`` (or directly with keyword
    arguments and section objects); every value is checked on construction
    and defaults are resolved, so a constructed config is complete:
    ``num_speculative_tokens``, ``prompt_lookup_*`` (ngram), ``tree.*`` and
    ``controller.max_draft_tokens`` are never null afterwards where they apply.
    """

    method: Optional[str] = key(None, f"{' | '.join(registry.method_names())} (vLLM's *_mtp names mean mtp); "
                                      "null = draft_model when `model` is set.")
    model: Optional[Text] = key(None, "Draft weights (path); null = the embedded default drafter for the method.")
    num_speculative_tokens: Optional[Int] = key(None, "Draft tokens per step, 1..64; null = 4, or the node "
                                                      "count of `speculative_token_tree`; for suffix and a bare "
                                                      "hybrid (no hybrid.methods) the suffix tree depth, a ceiling "
                                                      "(the hybrid's other methods then draft 4).",
                                                ge=1, le=MAX_SPECULATIVE_TOKENS)
    prompt_lookup_min: Optional[Int] = key(None, "ngram: shortest n-gram matched; null = prompt_lookup_max, or 5.", ge=1)
    prompt_lookup_max: Optional[Int] = key(None, "ngram: longest n-gram matched; null = prompt_lookup_min, or 5.", ge=1)
    suffix_decoding_max_tree_depth: Int = key(24, "suffix: the longest match plus speculation, in tokens (2..256); "
                                                  "also the default num_speculative_tokens of method suffix.",
                                              ge=2, le=MAX_TREE_BUDGET)
    suffix_decoding_max_cached_requests: Int = key(10000, "suffix: finished responses in the global cache, oldest "
                                                          "evicted first; 0 = no global cache (prompt trees only).",
                                                   ge=0, le=10_000_000)
    suffix_decoding_max_spec_factor: Float = key(1.0, "suffix: speculation depth <= this x the match length (> 0).",
                                                 gt=0.0, le=1000.0)
    suffix_decoding_min_token_prob: Float = key(0.1, "suffix: tokens whose share of the matched occurrences is "
                                                     "below this are not drafted, in [0, 1].", ge=0.0, le=1.0)
    suffix_decoding_corpus: Optional[str] = key(None, "suffix (hyspec's key): a corpus of the target's own answers "
                                                      "searched like the cache, read-only; null / \"none\" = none; "
                                                      "\"default\" = the one in assets/ for the default model; or a "
                                                      "directory.")
    draft_tensor_parallel_size: Optional[Any] = key(None, "Only 1 (or null) is supported by hyspec.")
    disable_by_batch_size: Optional[Int] = key(None, "As vLLM: speculation off for new requests while the batch "
                                                     "holds more than this many (>= 2); null = off.", ge=2)
    speculative_token_tree: TokenTree = key(
        None, "vLLM's static EAGLE tree, e.g. \"[(0,), (1,), (0, 0)]\": each tuple is a path of child "
              "ranks from the root; null = chains / dynamic trees.")
    max_model_len: Optional[Int] = key(None, "Longest context the drafter sees (>= 1); null = the target's.", ge=1)
    quantization: Optional[Literal[QUANTIZATION]] = key(
        None, "How the drafter's own linear layers compute: null = int8 (Q8_0 blocks) "
              "where the backend has a kernel for all of a drafter's layers, else "
              "dense; \"none\" = dense; "
              "\"int8\" / \"int4\" = demanded (an error naming a layer the backend "
              "cannot run so).  The drafter's numerics move only its acceptance, never "
              "the output.")
    tree: TreeSection = key(TreeConfig(), "Draft-tree shape: budget, depth, topk.")
    controller: ControllerSection = key(ControllerConfig(), "Goodput controller settings.")
    quality: QualitySection = key(QualityConfig(), "Draft-quality monitor settings.")
    draft_placement: Literal[PLACEMENTS] = key("local", "\"local\" (drafter beside the target) or \"remote\" "
                                                        "(Ray CPU workers).")
    ray_address: Optional[Text] = key(None, "Ray cluster for remote drafting; null = start a local Ray on demand.")
    remote: RemoteSection = key(RemoteConfig(), "Remote drafting settings.")
    hybrid: HybridSection = key(HybridConfig(), "Hybrid dispatcher settings.")
    memory_pressure: MemoryPressureSection = key(MemoryPressureConfig(), "Drafters under KV memory pressure.")
    slo: SLOSection = key(SLOConfig(), "Objectives that switch speculation off while breached (TTFT p99).")

    def __post_init__(self) -> None:
        if self.method is None:
            if self.model is None:
                chk.invalid("method", f"required when no model is given; one of {', '.join(registry.method_names())}")
            object.__setattr__(self, "method", "draft_model")  # vLLM's fallback for a bare model
        object.__setattr__(self, "method", _canonical_method(self.method))
        _check_model_allowed(self)
        _resolve_prompt_lookup(self)
        bare_hybrid_default = (self.method == "hybrid" and not self.hybrid.methods
                               and self.num_speculative_tokens is None)
        self._check_suffix(bare_hybrid_default)
        tp = self.draft_tensor_parallel_size
        if tp is not None and (isinstance(tp, bool) or not isinstance(tp, int) or tp != 1):
            chk.invalid("draft_tensor_parallel_size", f"only 1 is supported by hyspec (drafters run on one device), "
                                                      f"got {tp!r}")
        self._resolve_token_tree()
        self._resolve_tree_section(DEFAULT_NUM_SPECULATIVE_TOKENS if bare_hybrid_default else None)
        self._resolve_controller()
        if self.ray_address is not None and self.draft_placement != "remote":
            chk.invalid("ray_address", 'only used with draft_placement "remote"')
        self._check_hybrid()

    # -- resolution of defaults that depend on other keys -----------------------------
    def _check_suffix(self, bare_hybrid_default: bool = False) -> None:
        if self.suffix_decoding_corpus is not None and not self.suffix_decoding_corpus.strip():
            chk.invalid("suffix_decoding_corpus", 'a directory, "none" or null; got an empty string')
        if (self.method == "suffix" and self.num_speculative_tokens is None) or bare_hybrid_default:
            # vLLM's default for suffix: the tree depth (a ceiling; the drafter sizes each draft itself).  A bare
            # hybrid loads suffix too, so its ceiling is suffix's; its other methods draft up to the tree depth,
            # DEFAULT_NUM_SPECULATIVE_TOKENS (_resolve_tree_section, hyspec.spec.methods.default_hybrid_specs)
            object.__setattr__(self, "num_speculative_tokens",
                               min(self.suffix_decoding_max_tree_depth, MAX_SPECULATIVE_TOKENS))

    def _resolve_token_tree(self) -> None:
        if self.speculative_token_tree is None:
            if self.num_speculative_tokens is None:
                object.__setattr__(self, "num_speculative_tokens", DEFAULT_NUM_SPECULATIVE_TOKENS)
            return
        if self.method == registry.HYBRID or not registry.get(self.method).builds_trees:
            trees = registry.tree_methods()
            chk.invalid("speculative_token_tree", f"method {self.method!r} drafts chains; a static tree "
                                                  f"applies to {', '.join(trees[:-1])} and {trees[-1]}")
        tree = parse_token_tree(self.speculative_token_tree, f"{ROOT}.speculative_token_tree")
        object.__setattr__(self, "speculative_token_tree", tree)
        if self.num_speculative_tokens is None:
            if len(tree) > MAX_SPECULATIVE_TOKENS:
                chk.invalid("speculative_token_tree",
                            f"{len(tree)} nodes exceed the {MAX_SPECULATIVE_TOKENS} draft tokens allowed")
            object.__setattr__(self, "num_speculative_tokens", len(tree))
        elif self.num_speculative_tokens != len(tree):
            # vLLM verifies one slot per tree node: the two must agree.
            chk.invalid("num_speculative_tokens", f"{self.num_speculative_tokens} != the "
                                                  f"{len(tree)} nodes of speculative_token_tree")

    def _resolve_tree_section(self, default_depth: int | None = None) -> None:
        t, static = self.tree, self.speculative_token_tree
        if static is not None:
            nodes, depth = len(static), max(len(n) for n in static)
            width = max(n[-1] for n in static) + 1
            for name, need in (("budget", nodes), ("depth", depth), ("topk", width)):
                value = getattr(t, name)
                if value is not None and value < need:
                    raise ConfigError(f"{ROOT}.tree.{name}", f"{value} is smaller than speculative_token_tree "
                                                             f"needs ({need})")
            budget, depth, topk = t.budget or nodes, t.depth or depth, t.topk or width
        else:
            budget = t.budget or 32
            depth = t.depth or min(default_depth or self.num_speculative_tokens, budget)
            topk = t.topk or min(8, budget)
        try:
            resolved = TreeConfig(budget=budget, depth=depth, topk=topk)
        except ConfigError as e:  # a default combined with an explicit value can still conflict
            raise ConfigError(e.key, str(e)[len(e.key) + 2:] + " (after resolving defaults)") from None
        object.__setattr__(self, "tree", resolved)

    def _resolve_controller(self) -> None:
        c = self.controller
        if c.max_draft_tokens is None:
            if c.min_draft_tokens > self.num_speculative_tokens:
                raise ConfigError(f"{ROOT}.controller.min_draft_tokens", f"{c.min_draft_tokens} exceeds "
                                  f"num_speculative_tokens {self.num_speculative_tokens}")
            object.__setattr__(self, "controller",
                               dataclasses.replace(c, max_draft_tokens=self.num_speculative_tokens))
        elif c.max_draft_tokens > self.num_speculative_tokens:
            raise ConfigError(f"{ROOT}.controller.max_draft_tokens", f"{c.max_draft_tokens} exceeds "
                              f"num_speculative_tokens {self.num_speculative_tokens}")

    def _check_hybrid(self) -> None:
        h = self.hybrid
        if self.method == "hybrid":
            # No methods listed: the engine loads ngram and every embedded default drafter it finds.
            for i, m in enumerate(h.methods):
                k, where = m.num_speculative_tokens, f"{ROOT}.hybrid.methods[{i}].num_speculative_tokens"
                # the top-level value sizes the controller and the verification buffers
                if k is not None and k > self.num_speculative_tokens:
                    raise ConfigError(where, f"{k} exceeds the top-level num_speculative_tokens "
                                             f"{self.num_speculative_tokens}")
                if k is not None and k < self.controller.min_draft_tokens:
                    raise ConfigError(where, f"{k} is below controller.min_draft_tokens "
                                             f"{self.controller.min_draft_tokens}")
            methods = tuple(m if m.num_speculative_tokens is not None
                            else dataclasses.replace(m, num_speculative_tokens=self.num_speculative_tokens)
                            for m in h.methods)
            object.__setattr__(self, "hybrid", dataclasses.replace(h, methods=methods))
        elif h.methods:
            raise ConfigError(f"{ROOT}.hybrid.methods", f'only used with method "hybrid" (method is {self.method!r})')

    # -- construction / export ---------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SpeculativeConfig":
        """Build from vLLM's JSON shape plus hyspec's sections; raises ConfigError naming the key."""
        return chk.validate(cls, data, VLLM_UNSUPPORTED_KEYS)

    @classmethod
    def from_json(cls, source: str | os.PathLike[str]) -> "SpeculativeConfig":
        """Build from JSON text (starting with '{' or '[') or the path of a JSON file."""
        if isinstance(source, os.PathLike) or not str(source).lstrip().startswith(("{", "[")):
            path = Path(source)
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as e:
                raise ConfigError(ROOT, f"cannot read {str(path)!r}: {e.strerror or e}") from None
        else:
            text = str(source)
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(ROOT, f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        """JSON-shaped mapping; ``from_dict(cfg.to_dict()) == cfg``.  The static tree is vLLM's string form."""
        out = chk.to_dict(self)
        if self.speculative_token_tree is not None:
            out["speculative_token_tree"] = str(list(self.speculative_token_tree))
        return out

    @staticmethod
    def describe() -> str:
        """The key reference as Markdown (for the README)."""
        parts = ["## `speculative_config` keys", "",
                 "vLLM's keys keep vLLM's names and meaning; keys vLLM has but hyspec does not "
                 "implement are rejected as *not supported by hyspec*.", ""]
        parts += chk.markdown_table(SpeculativeConfig, "")
        for name, cls in (("tree", TreeConfig), ("controller", ControllerConfig), ("quality", QualityConfig),
                          ("remote", RemoteConfig), ("hybrid", HybridConfig),
                          ("hybrid.methods[]", MethodConfig), ("memory_pressure", MemoryPressureConfig),
                          ("slo", SLOConfig)):
            parts += ["", f"### `{name}`", "", (cls.__doc__ or "").split("\n\n")[0].strip(), ""]
            parts += chk.markdown_table(cls, f"{name}.")
        return "\n".join(parts) + "\n"

    @staticmethod
    def json_schema() -> dict[str, Any]:
        """The JSON Schema of ``speculative_config``, generated from the models (``docs/speculative_config.schema.json``)."""
        return chk.json_schema(SpeculativeConfig)


# ---------------------------------------------------------------- shared rules

def _canonical_method(value: Any) -> str:
    """The registered name ``value`` means (vLLM's per-model ``*_mtp`` names mean mtp)."""
    methods = registry.method_names()
    if not isinstance(value, str):
        chk.invalid("method", f"expected a method name, got {value!r}")
    if value in methods:
        return value
    if value.endswith("_mtp"):  # vLLM's deprecated per-model MTP names (deepseek_mtp, mimo_mtp, ...)
        return "mtp"
    if value in UNSUPPORTED_METHODS:
        chk.invalid("method", f"{value!r} is not supported by hyspec: {UNSUPPORTED_METHODS[value]}")
    chk.invalid("method", f"unknown method {value!r}{chk.did_you_mean(value, methods)}; one of {', '.join(methods)}")


def _check_model_allowed(obj: Any) -> None:
    hybrid = obj.method == registry.HYBRID
    info = None if hybrid else registry.get(obj.method)
    if (hybrid or not info.weights) and obj.model in (obj.method, f"[{obj.method}]"):
        object.__setattr__(obj, "model", None)  # vLLM writes the method name into `model` for ngram
    if obj.model is None:
        return
    if hybrid:
        chk.invalid("model", f"a {obj.method} has no model of its own; set it per method in {obj.method}.methods")
    if not info.weights:
        chk.invalid("model", f"{info.name} ({info.summary}) has no weights; remove the key")


def _resolve_prompt_lookup(obj: Any) -> None:
    """vLLM's rule: both null -> 5/5; one given -> the other equals it; min <= max; ngram only."""
    lo, hi = obj.prompt_lookup_min, obj.prompt_lookup_max
    if obj.method != "ngram":
        for name in ("prompt_lookup_min", "prompt_lookup_max"):
            if getattr(obj, name) is not None:
                chk.invalid(name, f"only used with method 'ngram' (method is {obj.method!r})")
        return
    if lo is None and hi is None:
        lo = hi = DEFAULT_PROMPT_LOOKUP
    lo = hi if lo is None else lo
    hi = lo if hi is None else hi
    if lo > hi:
        chk.invalid("prompt_lookup_min", f"{lo} exceeds prompt_lookup_max {hi}")
    object.__setattr__(obj, "prompt_lookup_min", lo)
    object.__setattr__(obj, "prompt_lookup_max", hi)


def parse_token_tree(value: Any, path: str) -> tuple[tuple[int, ...], ...]:
    """vLLM's ``speculative_token_tree`` (string or JSON list of paths), checked and sorted breadth-first.

    A node is the path of child ranks from the root: ``(0,)`` is the root's
    best child, ``(0, 1)`` that child's second-best.  Well-formed means every
    node's parent is present and so is its next-better sibling.
    """
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError) as e:
            raise ConfigError(path, f"not a list of tuples: {e}") from None
    if not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(path, "expected a non-empty list of node paths such as [(0,), (0, 0)]")
    nodes: list[tuple[int, ...]] = []
    for item in value:
        if (not isinstance(item, (list, tuple)) or not item
                or any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in item)):
            raise ConfigError(path, f"node {item!r} is not a non-empty tuple of child ranks >= 0")
        nodes.append(tuple(item))
    present = set(nodes)
    if len(present) != len(nodes):
        raise ConfigError(path, "duplicate nodes")
    for node in nodes:
        if len(node) > 1 and node[:-1] not in present:
            raise ConfigError(path, f"node {node} has no parent {node[:-1]}")
        if node[-1] > 0 and node[:-1] + (node[-1] - 1,) not in present:
            raise ConfigError(path, f"node {node} has no better-ranked sibling {node[:-1] + (node[-1] - 1,)}")
    return tuple(sorted(nodes, key=lambda n: (len(n), n)))
