"""The method table: one entry (name -> factory and facts) per method, read by everything that lists methods.

A new method is one ``register(MethodInfo(...))`` plus its package: here a
test-only method (``tests/spec/repeat_last.py``) becomes a valid config,
dispatcher rule and signal, bench and probe method, and decodes exactly as
plain decoding does at temperature 0.  The docs' method lists are held to the
registry too.
"""
from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from hyspec import LLM, SamplingParams
from hyspec.errors import ConfigError, HyspecError
from hyspec.spec import registry
from hyspec.spec.config import SpeculativeConfig
from hyspec.spec.registry import MethodInfo
from tests.spec.conftest import PROMPTS
from tests.spec.repeat_last import NAME, RepeatLastProposer, build

ROOT = Path(__file__).resolve().parents[2]
GREEDY = SamplingParams(temperature=0, max_tokens=60)
FAST = {"controller": {"enabled": False, "profile_at_startup": False}}
REPEAT_LAST = MethodInfo(NAME, "the last token repeated (test only)", build, weights=False, chain_only=True)


@contextmanager
def registered(info: MethodInfo):
    registry.register(info)
    try:
        yield info
    finally:
        registry.unregister(info.name)


@pytest.fixture
def repeat_last():
    with registered(REPEAT_LAST) as info:
        yield info
    assert NAME not in registry.METHODS


# ---------------------------------------------------------------- a new method, everywhere at once

def test_config_validation_accepts_a_registered_method(repeat_last):
    cfg = SpeculativeConfig.from_dict({"method": NAME, "num_speculative_tokens": 3})
    assert (cfg.method, cfg.num_speculative_tokens) == (NAME, 3)
    hybrid = SpeculativeConfig.from_dict({"method": "hybrid", "hybrid": {"methods": ["ngram", NAME]},
                                          "remote": {"fallback_method": NAME}})
    assert [m.method for m in hybrid.hybrid.methods] == ["ngram", NAME]
    # its entry's flags drive the checks: no weights, chains only
    with pytest.raises(ConfigError, match="has no weights"):
        SpeculativeConfig.from_dict({"method": NAME, "model": "/m/x"})
    with pytest.raises(ConfigError, match=f"method '{NAME}' drafts chains; a static tree applies to draft_model"):
        SpeculativeConfig.from_dict({"method": NAME, "speculative_token_tree": "[(0,)]"})


def test_the_dispatcher_accepts_a_registered_method(repeat_last, tmp_path):
    from hyspec.policy.conditions import compile_condition
    from hyspec.policy.dispatcher import HybridDispatcher
    from hyspec.policy.rules import parse_rules
    from hyspec.policy.signals import METHODS, StepSignals

    assert NAME in METHODS and list(METHODS)[-1] == NAME
    signals = StepSignals(context_length=10, accept_rate={NAME: 0.5}, goodput={NAME: 100.0})
    assert compile_condition(f"accept_rate.{NAME} > 0.2")(signals)
    assert [r.method for r in parse_rules(json.dumps([{"method": NAME}]))] == [NAME]
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps([{"when": "context_length < 5", "method": "ngram"}, {"method": NAME}]))
    dispatcher = HybridDispatcher(rules, ["ngram", NAME])
    assert dispatcher.choose(signals) == NAME


def test_bench_probe_and_conformance_list_a_registered_method(repeat_last):
    from hyspec.backends.records import drafting_methods
    from hyspec.bench.hyspec_runs import speculative_config
    from hyspec.bench.settings import BenchSettings, bench_methods
    from hyspec.conformance.methods import methods_to_check

    assert NAME in bench_methods() and NAME not in registry.drafter_methods()  # no weights: nothing in assets/
    settings = BenchSettings(methods=(NAME, "ngram"))
    assert settings.methods == ("none", "ngram", NAME)
    assert speculative_config(NAME, settings, {}) == {"method": NAME, "num_speculative_tokens": 4}
    assert NAME in drafting_methods() and NAME in methods_to_check()


def test_a_registered_method_decodes_exactly_as_plain(repeat_last, target_dir, plain_outputs):
    llm = LLM(str(target_dir), dtype="float32", kv_cache_bytes=8 << 20,
              speculative_config={**FAST, "method": NAME, "num_speculative_tokens": 3})
    proposer = llm.engine.spec.proposers[NAME]
    assert isinstance(proposer, RepeatLastProposer) and proposer.built_for == [NAME]
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == plain_outputs
    assert llm.engine.spec.metrics.snapshot()["totals"]["draft_tokens"] > 0  # it really drafted
    llm.engine.pool.assert_all_free()


def test_hybrid_switches_to_a_registered_method(repeat_last, target_dir, plain_outputs, tmp_path):
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps([{"when": "max_context_length < 30", "method": "ngram"}, {"method": NAME}]))
    llm = LLM(str(target_dir), dtype="float32", kv_cache_bytes=8 << 20, speculative_config={
        **FAST, "method": "hybrid", "num_speculative_tokens": 3,
        "hybrid": {"rules_path": str(rules), "methods": ["ngram", NAME]}})
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == plain_outputs
    decisions = llm.engine.spec.dispatcher.snapshot().decisions
    assert decisions[NAME] > 0 and decisions["ngram"] > 0


def test_registering_is_undone():
    with registered(REPEAT_LAST):
        assert NAME in registry.method_names()
    assert NAME not in registry.METHODS and NAME not in registry.method_names()
    with pytest.raises(ConfigError, match=f"unknown method '{NAME}'"):
        SpeculativeConfig.from_dict({"method": NAME})
    from hyspec.policy.signals import StepSignals

    with pytest.raises(HyspecError, match="unknown method"):
        StepSignals(accept_rate={NAME: 0.5})


# ---------------------------------------------------------------- the registry itself

def test_entries_are_checked():
    with pytest.raises(HyspecError, match="already registered"):
        registry.register(registry.METHODS["ngram"])
    with pytest.raises(HyspecError, match="lower-case identifier"):
        MethodInfo("Eagle-4", "x", build)
    for reserved in ("none", "hybrid"):
        with pytest.raises(HyspecError, match="lower-case identifier other than"):
            MethodInfo(reserved, "x", build)
    with pytest.raises(HyspecError, match="needs a factory"):
        MethodInfo("x", "x", "hyspec.drafters.x:build")  # a callable, not a name to import
    with pytest.raises(HyspecError, match="no weights"):
        MethodInfo("x", "x", build, weights=False, drafter_dir="x")


def test_a_factory_gets_its_section_and_resolved_weights(tmp_path):
    from hyspec.spec.methods import build_proposer, method_specs

    seen = []
    factory = lambda target, spec, weights: seen.append((spec, weights)) or RepeatLastProposer(2, 10)  # noqa: E731
    with registered(MethodInfo("ghost", "x", factory, weights=False)):
        [spec] = method_specs(SpeculativeConfig(method="ghost", num_speculative_tokens=2))
        build_proposer(None, spec)
    assert seen == [(spec, None)] and (spec.method, spec.num_speculative_tokens) == ("ghost", 2)
    with registered(MethodInfo("ghost", "x", factory, drafter_dir="nowhere")):
        [spec] = method_specs(SpeculativeConfig(method="ghost", model=str(tmp_path)))
        build_proposer(None, spec)
    assert seen[-1] == (spec, tmp_path)  # the configured model, as a path
    with pytest.raises(ConfigError, match="unknown method 'ghost'"):
        build_proposer(None, spec)
    with pytest.raises(ConfigError, match="builds no proposer"):
        build_proposer(None, dataclasses.replace(spec, method="hybrid"))


def test_builtin_entries_resolve():
    import importlib.util

    for info in registry.METHODS.values():
        assert callable(info.factory), info.name
        if info.recipe:
            assert importlib.util.find_spec(info.recipe) is not None, info.recipe
    assert registry.default_hybrid_methods() == ("dflash", "mtp", "eagle", "eagle3", "dspark", "draft_model")
    assert registry.method_names()[-1] == "hybrid"


def test_registry_and_its_readers_import_no_torch():
    code = ("import sys\n"
            "import hyspec.spec.registry, hyspec.spec.config, hyspec.backends.records, hyspec.bench.settings\n"
            "import hyspec.assets, hyspec.train.registry, hyspec.policy, hyspec.drafters.eagle, hyspec.drafters.methods\n"
            "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "PATH": ""})
    assert out.stdout.strip() == "False", out.stdout + out.stderr


# ---------------------------------------------------------------- the docs list the registry's methods

def _between(text: str, start: str, end: str) -> str:
    i = text.index(start) + len(start)
    return text[i:text.index(end, i)]


def _ticked(text: str) -> list[str]:
    return re.findall(r"`([a-z0-9_]+)`", text)


def test_docs_list_exactly_the_registry_methods():
    names = list(registry.method_names())
    arch = _between((ROOT / "docs/architecture.md").read_text(), "## 5. Drafting methods", "\n## ")
    rows = [line.split("|")[1] for line in arch.splitlines() if line.startswith("| `")]
    assert [n for row in rows for n in _ticked(row)] == names, "docs/architecture.md §5"
    probe = (ROOT / "docs/probe.md").read_text()
    assert _ticked(_between(probe, "drafting methods that run here: all of", "when available")) == names
    listed = re.findall(r"^  methods {2,}(.+)$", probe, re.M)  # the probe's printed methods line
    assert listed and all(line.split() == names for line in listed), "docs/probe.md"
    readme = (ROOT / "README.md").read_text()
    assert _ticked(_between(readme, "Drafting methods:", "Drafters can run")) == names, "README.md"
    bench = _between((ROOT / "docs/bench.md").read_text(), "// hyspec: ", ";")
    assert bench.split("|") == ["none", *names], "docs/bench.md"
    conformance = (ROOT / "docs/conformance.md").read_text()
    assert _ticked(_between(conformance, "drafting method the build has:", "; plus")) == names


def test_speculative_config_md_is_describe():
    text = (ROOT / "docs/speculative_config.md").read_text()
    assert text.endswith(SpeculativeConfig.describe()), \
        "regenerate docs/speculative_config.md from SpeculativeConfig.describe()"
