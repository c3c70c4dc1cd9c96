"""speculative_config: vLLM's shape accepted, defaults resolved, every bad key named by its dotted path."""
from __future__ import annotations

import dataclasses
import json

import pytest

from hyspec.errors import ConfigError
from hyspec.spec.ops_config import MemoryPressureConfig, SLOConfig
from hyspec.spec.config import (MAX_TREE_BUDGET, ControllerConfig, HybridConfig, MethodConfig, QualityConfig,
                                RemoteConfig, SpeculativeConfig, TreeConfig, parse_token_tree)

SECTIONS = {"tree": TreeConfig, "controller": ControllerConfig, "quality": QualityConfig,
            "remote": RemoteConfig, "hybrid": HybridConfig, "memory_pressure": MemoryPressureConfig,
            "slo": SLOConfig}


def test_vllm_ngram_config_resolves_like_vllm():
    cfg = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3,
                                       "prompt_lookup_max": 5, "prompt_lookup_min": 3})
    assert (cfg.method, cfg.num_speculative_tokens, cfg.prompt_lookup_min, cfg.prompt_lookup_max) == ("ngram", 3, 3, 5)
    # vLLM: neither bound -> 5/5; one bound -> the other equals it
    assert (SpeculativeConfig(method="ngram").prompt_lookup_min, SpeculativeConfig(method="ngram").prompt_lookup_max) == (5, 5)
    only_max = SpeculativeConfig(method="ngram", prompt_lookup_max=2)
    assert (only_max.prompt_lookup_min, only_max.prompt_lookup_max) == (2, 2)
    # vLLM writes the method name into `model` for ngram
    assert SpeculativeConfig.from_dict({"method": "ngram", "model": "ngram"}).model is None


def test_defaults_are_resolved():
    cfg = SpeculativeConfig(method="eagle")
    assert cfg.num_speculative_tokens == 4
    assert (cfg.tree.budget, cfg.tree.depth, cfg.tree.topk) == (32, 4, 8)
    assert cfg.controller.max_draft_tokens == 4 and cfg.controller.ewma_alpha == 0.05
    assert (cfg.quality.min_acceptance, cfg.quality.max_std) == (0.6, 0.15)
    assert (cfg.remote.ping_interval_ms, cfg.remote.max_missed_pings, cfg.remote.busy_threshold) == (200, 3, 0.95)
    assert (cfg.hybrid.load_threshold, cfg.hybrid.load_resume_threshold) == (0.75, 0.6)
    assert cfg.draft_placement == "local" and cfg.ray_address is None
    assert cfg.prompt_lookup_min is None  # ngram-only keys stay unset for other methods
    # a bare model means draft_model, as in vLLM
    assert SpeculativeConfig(model="/ckpt/draft").method == "draft_model"
    # a null section means its defaults
    assert SpeculativeConfig.from_dict({"method": "eagle", "tree": None, "controller": None}) == cfg


def test_vllm_mtp_aliases_map_to_mtp():
    assert SpeculativeConfig(method="deepseek_mtp").method == "mtp"
    assert SpeculativeConfig.from_dict({"method": "mimo_mtp"}).method == "mtp"


@pytest.mark.parametrize("data", [
    {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4, "num_speculative_tokens": 6},
    {"method": "eagle", "speculative_token_tree": "[(0,), (1,), (0, 0), (0, 1), (0, 0, 0)]"},
    {"method": "hybrid", "hybrid": {"methods": ["ngram", {"method": "eagle3", "model": "/m/e3"}],
                                    "speculative_fraction": 0.05, "load_signal": "kv_usage"}},
    {"method": "draft_model", "model": "/m/d", "draft_placement": "remote", "ray_address": "10.0.0.2:6379",
     "remote": {"draft_deadline_ms": 80, "fallback_method": "none"}, "controller": {"min_draft_tokens": 2}},
])
def test_round_trip_through_dict_and_json(data, tmp_path):
    cfg = SpeculativeConfig.from_dict(data)
    assert SpeculativeConfig.from_dict(cfg.to_dict()) == cfg
    text = json.dumps(cfg.to_dict())
    assert SpeculativeConfig.from_json(text) == cfg
    path = tmp_path / "spec.json"
    path.write_text(text)
    assert SpeculativeConfig.from_json(path) == cfg
    assert SpeculativeConfig.from_json(str(path)) == cfg


def test_static_tree_is_kept_sorted_and_sizes_the_tree_section():
    cfg = SpeculativeConfig.from_dict({"method": "eagle", "speculative_token_tree": [[0, 0], [1], [0]]})
    assert cfg.speculative_token_tree == ((0,), (1,), (0, 0))
    assert cfg.num_speculative_tokens == 3
    assert (cfg.tree.budget, cfg.tree.depth, cfg.tree.topk) == (3, 2, 2)
    assert cfg.to_dict()["speculative_token_tree"] == "[(0,), (1,), (0, 0)]"  # vLLM's string form
    explicit = SpeculativeConfig.from_dict({"method": "eagle", "num_speculative_tokens": 3, "tree": {"budget": 3},
                                            "speculative_token_tree": "[(0,), (1,), (0, 0)]"})
    assert explicit == cfg


def _err(data) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        SpeculativeConfig.from_dict(data)
    return info.value


@pytest.mark.parametrize("data, key, words", [
    ({"method": "ngram", "num_speculative_tokens": 0}, "speculative_config.num_speculative_tokens", ">= 1"),
    ({"method": "ngram", "num_speculative_tokens": -3}, "speculative_config.num_speculative_tokens", ">= 1"),
    ({"method": "ngram", "num_speculative_tokens": 10_000}, "speculative_config.num_speculative_tokens", "<= 64"),
    ({"method": "ngram", "num_speculative_tokens": "4"}, "speculative_config.num_speculative_tokens", "integer"),
    ({"method": "ngram", "num_speculative_tokens": True}, "speculative_config.num_speculative_tokens", "integer"),
    ({"method": "warp"}, "speculative_config.method", "unknown method"),
    ({}, "speculative_config.method", "required"),
    ({"method": "medusa"}, "speculative_config.method", "not supported by hyspec"),
    ({"method": "ngram", "model": "/m/x"}, "speculative_config.model", "no weights"),
    ({"method": "eagle", "prompt_lookup_min": 2}, "speculative_config.prompt_lookup_min", "only used with method 'ngram'"),
    ({"method": "ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "speculative_config.prompt_lookup_min", "exceeds"),
    ({"method": "ngram", "prompt_lookup_max": 0}, "speculative_config.prompt_lookup_max", ">= 1"),
    ({"method": "eagle", "draft_tensor_parallel_size": 2}, "speculative_config.draft_tensor_parallel_size", "only 1"),
    ({"method": "eagle", "disable_by_batch_size": 1}, "speculative_config.disable_by_batch_size", ">= 2"),
    ({"method": "eagle", "max_model_len": 0}, "speculative_config.max_model_len", ">= 1"),
    ({"method": "ngram", "speculative_token_tree": "[(0,)]"}, "speculative_config.speculative_token_tree", "chains"),
    ({"method": "eagle", "speculative_token_tree": "[(0,), (0, 0, 0)]"}, "speculative_config.speculative_token_tree", "parent"),
    ({"method": "eagle", "speculative_token_tree": "[(0,), (2,)]"}, "speculative_config.speculative_token_tree", "sibling"),
    ({"method": "eagle", "speculative_token_tree": "[(0,), (0,)]"}, "speculative_config.speculative_token_tree", "duplicate"),
    ({"method": "eagle", "speculative_token_tree": "[(0,), (-1,)]"}, "speculative_config.speculative_token_tree", ">= 0"),
    ({"method": "eagle", "speculative_token_tree": "not a tree("}, "speculative_config.speculative_token_tree", "tuples"),
    ({"method": "eagle", "speculative_token_tree": "[(0,), (1,)]", "num_speculative_tokens": 4},
     "speculative_config.num_speculative_tokens", "2 nodes"),
    ({"method": "eagle", "tree": {"budget": MAX_TREE_BUDGET + 1}}, "speculative_config.tree.budget", "<= 256"),
    ({"method": "eagle", "tree": {"budget": 4, "depth": 8}}, "speculative_config.tree.depth", "exceeds tree.budget"),
    ({"method": "eagle", "speculative_token_tree": "[(0,), (1,), (2,)]", "tree": {"topk": 2}},
     "speculative_config.tree.topk", "smaller than speculative_token_tree"),
    ({"method": "eagle", "tree": []}, "speculative_config.tree", "expected an object"),
    ({"method": "eagle", "controller": {"ewma_alpha": 0}}, "speculative_config.controller.ewma_alpha", "> 0"),
    ({"method": "eagle", "controller": {"ewma_alpha": 1.5}}, "speculative_config.controller.ewma_alpha", "<= 1"),
    ({"method": "eagle", "controller": {"ewma_alpha": float("nan")}}, "speculative_config.controller.ewma_alpha", "finite"),
    ({"method": "eagle", "controller": {"enabled": "yes"}}, "speculative_config.controller.enabled", "true or false"),
    ({"method": "eagle", "controller": {"min_draft_tokens": 3, "max_draft_tokens": 2}},
     "speculative_config.controller.min_draft_tokens", "exceeds"),
    ({"method": "eagle", "controller": {"max_draft_tokens": 8}}, "speculative_config.controller.max_draft_tokens",
     "exceeds num_speculative_tokens"),
    ({"method": "eagle", "controller": {"min_draft_tokens": 5}}, "speculative_config.controller.min_draft_tokens",
     "exceeds num_speculative_tokens"),
    ({"method": "eagle", "quality": {"max_std": 0.7}}, "speculative_config.quality.max_std", "<= 0.5"),
    ({"method": "eagle", "quality": {"window": 1}}, "speculative_config.quality.window", ">= 2"),
    ({"method": "eagle", "draft_placement": "cloud"}, "speculative_config.draft_placement", "one of local, remote"),
    ({"method": "eagle", "ray_address": "auto"}, "speculative_config.ray_address", "remote"),
    ({"method": "eagle", "remote": {"ping_interval_ms": 0}}, "speculative_config.remote.ping_interval_ms", ">= 1"),
    ({"method": "eagle", "remote": {"busy_threshold": 0}}, "speculative_config.remote.busy_threshold", "> 0"),
    ({"method": "eagle", "remote": {"fallback_method": "hybrid"}}, "speculative_config.remote.fallback_method", "one of"),
    ({"method": "eagle", "hybrid": {"load_threshold": 0.5, "load_resume_threshold": 0.6}},
     "speculative_config.hybrid.load_resume_threshold", "below"),
    ({"method": "eagle", "hybrid": {"load_signal": "cpu"}}, "speculative_config.hybrid.load_signal", "one of"),
    ({"method": "eagle", "hybrid": {"speculative_fraction": 1.5}}, "speculative_config.hybrid.speculative_fraction", "<= 1"),
    ({"method": "eagle", "hybrid": {"methods": ["ngram"]}}, "speculative_config.hybrid.methods", 'only used with method "hybrid"'),
    ({"method": "hybrid", "model": "/m"}, "speculative_config.model", "per method"),
    ({"method": "hybrid", "hybrid": {"methods": "ngram"}}, "speculative_config.hybrid.methods", "expected a list"),
    ({"method": "hybrid", "hybrid": {"methods": ["ngram", "eagel"]}}, "speculative_config.hybrid.methods[1].method",
     "did you mean 'eagle'"),
    ({"method": "hybrid", "hybrid": {"methods": ["ngram", {"model": "/m"}]}}, "speculative_config.hybrid.methods[1].method",
     "required"),
    ({"method": "hybrid", "hybrid": {"methods": ["ngram", {"method": "ngram", "prompt_lookup_min": 0}]}},
     "speculative_config.hybrid.methods[1].prompt_lookup_min", ">= 1"),
    ({"method": "hybrid", "hybrid": {"methods": ["ngram", "hybrid"]}}, "speculative_config.hybrid.methods[1].method",
     "another hybrid"),
    ({"method": "hybrid", "hybrid": {"methods": ["eagle", "ngram", "eagle"]}}, "speculative_config.hybrid.methods[2].method",
     "already listed at methods[0]"),
    ({"method": "hybrid", "num_speculative_tokens": 4, "hybrid": {"methods": [{"method": "eagle", "num_speculative_tokens": 6}]}},
     "speculative_config.hybrid.methods[0].num_speculative_tokens", "exceeds the top-level"),
    ({"method": "hybrid", "controller": {"min_draft_tokens": 3},
      "hybrid": {"methods": ["ngram", {"method": "eagle", "num_speculative_tokens": 2}]}},
     "speculative_config.hybrid.methods[1].num_speculative_tokens", "below controller.min_draft_tokens"),
    ({"method": "hybrid", "hybrid": {"methods": [{"method": "ngram", "topk": 3}]}},
     "speculative_config.hybrid.methods[0].topk", "unknown key"),
])
def test_bad_values_name_the_dotted_key(data, key, words):
    e = _err(data)
    assert e.key == key, str(e)
    assert words in str(e), str(e)
    assert str(e).startswith(key + ": ")


def test_unknown_keys_suggest_the_closest_valid_key():
    e = _err({"method": "ngram", "num_speculative_token": 3})
    assert e.key == "speculative_config.num_speculative_token"
    assert "did you mean 'num_speculative_tokens'" in str(e)
    e = _err({"method": "ngram", "controller": {"ewma_alfa": 0.1}})
    assert e.key == "speculative_config.controller.ewma_alfa"
    assert "did you mean 'ewma_alpha'" in str(e)
    e = _err({"method": "ngram", "controler": {}})
    assert "did you mean 'controller'" in str(e)


@pytest.mark.parametrize("name", ["enforce_eager", "attention_backend",
                                  "num_speculative_tokens_per_batch_size", "rejection_sample_method",
                                  "parallel_drafting", "revision"])
def test_vllm_keys_hyspec_lacks_are_not_supported_rather_than_unknown(name):
    e = _err({"method": "ngram", name: None})
    assert e.key == f"speculative_config.{name}"
    assert "not supported by hyspec" in str(e)
    assert "unknown" not in str(e)


def test_json_errors_name_the_position_and_missing_files_the_path(tmp_path):
    with pytest.raises(ConfigError) as info:
        SpeculativeConfig.from_json('{"method": "ngram",\n "num_speculative_tokens": }')
    assert info.value.key == "speculative_config" and "line 2 column" in str(info.value)
    with pytest.raises(ConfigError) as info:
        SpeculativeConfig.from_json(tmp_path / "missing.json")
    assert "missing.json" in str(info.value)
    with pytest.raises(ConfigError) as info:
        SpeculativeConfig.from_json("[1, 2]")
    assert info.value.key == "speculative_config" and "expected an object" in str(info.value)
    with pytest.raises(ConfigError) as info:
        SpeculativeConfig.from_dict([("method", "ngram")])
    assert info.value.key == "speculative_config"


def test_configs_are_frozen_and_sections_validate_on_their_own():
    cfg = SpeculativeConfig(method="ngram")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.num_speculative_tokens = 9
    with pytest.raises(ConfigError) as info:
        ControllerConfig(ewma_alpha=-1)
    assert info.value.key == "speculative_config.controller.ewma_alpha"
    with pytest.raises(ConfigError) as info:
        SpeculativeConfig(method="ngram", controller={"ewma_alpha": 0.1})
    assert info.value.key == "speculative_config.controller"
    assert MethodConfig("eagle").model is None


def test_parse_token_tree_accepts_vllm_strings_and_json_lists():
    assert parse_token_tree("[(0,), (0, 0), (1,)]", "t") == ((0,), (1,), (0, 0))
    assert parse_token_tree([[0], [0, 0]], "t") == ((0,), (0, 0))
    with pytest.raises(ConfigError):
        parse_token_tree([], "t")


def test_every_key_is_documented_in_describe_and_in_the_docstrings():
    text = SpeculativeConfig.describe()
    assert text.startswith("## `speculative_config` keys")
    for f in dataclasses.fields(SpeculativeConfig):
        assert f"| `{f.name}` |" in text
        assert f.metadata["doc"]
        assert f"    {f.name} (default" in SpeculativeConfig.__doc__
    for section, cls in [*SECTIONS.items(), ("hybrid.methods[]", MethodConfig)]:
        for f in dataclasses.fields(cls):
            assert f"| `{section}.{f.name}` |" in text, (section, f.name)
            assert f.metadata["doc"], (section, f.name)
            assert f"    {f.name} (default" in cls.__doc__
