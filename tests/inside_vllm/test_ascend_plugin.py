"""hyspec's vllm-ascend plugin (hyspec.vllm.ascend_plugin) without an NPU: against the committed record of
vllm-ascend v0.23.0's shapes, and against fake ``vllm_ascend`` packages written from that record into a tmp
dir (the way npu_ops' emulated torch_npu is built from op-plugin's recorded signatures).  The fakes carry the
record's function names, parameters, imports and drafter calls; their bodies are stand-ins.  The plugin has not
run against the real vllm-ascend here (no NPU, no CANN): scripts/npu_first_contact.sh does that."""
from __future__ import annotations

import ast
import inspect
import json
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from hyspec.bench.vllm_server import PYTHON_ENV
from hyspec.vllm import HyspecProposer
from hyspec.vllm import ascend_plugin as plugin
from hyspec.vllm.ascend_shapes import (INPUT_BATCH, INPUT_BATCH_ARRAYS, INPUT_BATCH_CLASS, LIFECYCLE_METHODS,
                                       MODEL_RUNNER, RUNNER_CLASS, SPEC_DECODE, differences, load_record,
                                       parameters, read_shapes)

RECORD = load_record()
SHAPES = RECORD["shapes"]
FACTORY_KEY = f"{SPEC_DECODE}::get_spec_decode_method"
DISPATCH_KEY = f"{MODEL_RUNNER}::{RUNNER_CLASS}.propose_draft_token_ids"
GETTER_KEY = f"{MODEL_RUNNER}::{RUNNER_CLASS}._get_drafter"
REPEATING = [5, 6, 7, 8, 9, 1, 2, 5, 6, 7, 8, 9, 1, 2, 5, 6, 7]


# ---------------------------------------------------------------- (a) the plugin against the record


def test_the_record_names_the_source_it_was_read_from():
    assert RECORD["repository"] == "https://github.com/vllm-project/vllm-ascend"
    assert RECORD["tag"] == "v0.23.0" and re.fullmatch(r"[0-9a-f]{40}", RECORD["commit"])
    assert RECORD["vllm"] == "0.23.0"
    assert SHAPES["custom_class_branch"] is False  # v0.23.0 has no custom_class: why the plugin exists


def _names(params: list[str]) -> list[str]:
    return [p.rstrip("=") for p in params]


def test_the_plugins_wrappers_take_the_recorded_parameters():
    factory = plugin.with_custom_class(lambda *a: None)
    assert _names(parameters_of(factory)) == _names(SHAPES["functions"][FACTORY_KEY])
    # the dispatch passes everything but the sampled rows through untouched: its named parameters are the
    # record's first two, and the rest is *args / **kwargs
    dispatch = parameters_of(plugin.with_custom_dispatch(lambda *a, **k: None))
    assert dispatch[:2] == SHAPES["functions"][DISPATCH_KEY][:2] == ["self", "valid_sampled_token_ids"]
    assert dispatch[2:] == ["*args", "**kwargs"]


def parameters_of(function) -> list[str]:
    """A live function's parameters written as the record writes them (through ast, like the record)."""
    source = textwrap.dedent(inspect.getsource(function.__code__))
    return parameters(ast.parse(source).body[0])


def test_the_plugin_patches_what_the_record_says_the_runner_looks_up():
    assert SHAPES["imports"][f"{MODEL_RUNNER}::{plugin.FACTORY}"] == plugin.FACTORY_MODULE
    assert SHAPES["calls"][GETTER_KEY] == [plugin.FACTORY]  # _get_drafter reads the module global at call time
    assert SHAPES["functions"][GETTER_KEY] == ["self"]
    assert plugin.FACTORY_MODULE.replace(".", "/") + "/__init__.py" == SPEC_DECODE
    assert plugin.RUNNER_MODULE.replace(".", "/") + ".py" == MODEL_RUNNER
    assert DISPATCH_KEY.endswith("." + plugin.DISPATCH)


def test_the_drafter_answers_every_call_the_runner_makes_on_any_drafter():
    calls = {name for key in SHAPES["drafter_calls"].values() for name in key}
    assert calls == {"load_model", "dummy_run"}
    assert set(SHAPES["drafter_calls"]) == {f"{MODEL_RUNNER}::{m}" for m in LIFECYCLE_METHODS}
    for name in calls:
        assert callable(getattr(plugin.CustomClassDrafter, name))


def test_the_input_batch_has_the_arrays_the_dispatch_and_hyspecs_proposer_read():
    assert SHAPES["input_batch_arrays"] == list(INPUT_BATCH_ARRAYS)


# ---------------------------------------------------------------- fakes written from the record


def _signature(params: list[str]) -> str:
    return ", ".join(p[:-1] + "=None" if p.endswith("=") else p for p in params)


def write_fake_vllm_ascend(root: Path, shapes: dict, version: str = "0.23.0", branch: bool = False) -> Path:
    """A ``vllm_ascend`` package under ``root`` with ``shapes``' functions; ``branch``: its factory already
    handles custom_class (a vllm-ascend with PR #15710)."""
    fn, drafter_calls = shapes["functions"], shapes["drafter_calls"]
    pkg = root / "vllm_ascend"
    (pkg / "spec_decode").mkdir(parents=True)
    (pkg / "worker").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "worker" / "__init__.py").write_text("")
    own = '    if method == "custom_class":\n        return ("their own", vllm_config)\n' if branch else ""
    (root / SPEC_DECODE).write_text(
        f"def get_spec_decode_method({_signature(fn[FACTORY_KEY])}):\n{own}"
        '    if method == "ngram":\n        return ("ngram drafter", vllm_config)\n'
        '    raise ValueError(f"Unknown speculative decoding method: {method}")\n')
    lifecycle_args = {"load_model": "self.model", "dummy_run": "num_tokens=8, with_prefill=False, is_profile=True"}

    def lifecycle(method: str, signature: str) -> str:
        calls = drafter_calls[f"{MODEL_RUNNER}::{RUNNER_CLASS}.{method}"]
        body = "".join(f"        self.drafter.{c}({lifecycle_args.get(c, '')})\n" for c in calls)
        return f"    def {method}({signature}):\n        self.lifecycle.append({method!r})\n{body}"

    getter_calls = shapes["calls"][GETTER_KEY]
    assert getter_calls == ["get_spec_decode_method"], "the fake's _get_drafter body assumes the recorded call"
    (root / MODEL_RUNNER).write_text(
        f"from {shapes['imports'][f'{MODEL_RUNNER}::get_spec_decode_method']} import get_spec_decode_method\n\n\n"
        f"class {RUNNER_CLASS}:\n"
        "    def __init__(self, vllm_config, input_batch):\n"
        "        self.vllm_config, self.speculative_config = vllm_config, vllm_config.speculative_config\n"
        "        self.device, self.input_batch, self.model, self.lifecycle = 'npu', input_batch, 'target', []\n"
        "        self.drafter = self._get_drafter()\n\n"
        f"    def _get_drafter({_signature(fn[GETTER_KEY])}):\n"
        "        return get_spec_decode_method(self.speculative_config.method, self.vllm_config, self.device, self)\n\n"
        f"    def propose_draft_token_ids({_signature(fn[DISPATCH_KEY])}):\n"
        '        raise ValueError(f"Unknown speculative decoding method: {self.speculative_config.method}")\n\n'
        + lifecycle("load_model", "self") + "\n" + lifecycle("_dummy_run", "self, num_tokens"))
    arrays = shapes["input_batch_arrays"]
    (root / INPUT_BATCH).write_text(
        f"class {INPUT_BATCH_CLASS}:\n    def __init__(self, {', '.join(a.lstrip('_') for a in arrays)}):\n"
        + "".join(f"        self.{a} = {a.lstrip('_')}\n" for a in arrays)
        + "\n    @property\n    def req_ids(self):  # vLLM's InputBatch.req_ids, which NPUInputBatch inherits\n"
          "        return self._req_ids\n")
    dist = root / f"vllm_ascend-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm_ascend\nVersion: {version}\n")
    return root


def write_fake_vllm(root: Path) -> None:
    """vLLM's create_custom_proposer, where vLLM itself is not installed (hyspec's own venv)."""
    hook = root / "vllm" / "v1" / "spec_decode"
    hook.mkdir(parents=True)
    for folder in (root / "vllm", root / "vllm" / "v1", hook):
        (folder / "__init__.py").write_text("")
    (hook / "custom_class_proposer.py").write_text(textwrap.dedent('''\
        import importlib

        def create_custom_proposer(vllm_config):
            module, name = vllm_config.speculative_config.model.rsplit(".", 1)
            return getattr(importlib.import_module(module), name)(vllm_config)
        '''))


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A tmp dir on sys.path for fake packages; afterwards the imported fakes and the plugin's import hook go."""
    monkeypatch.delenv(plugin.SWITCH_ENV, raising=False)
    before_modules, before_path = set(sys.modules), list(sys.meta_path)
    try:
        import vllm.v1.spec_decode.custom_class_proposer  # noqa: F401  (the real hook, inside vLLM's venv)
    except ImportError:
        write_fake_vllm(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.meta_path[:] = before_path
    for name in set(sys.modules) - before_modules:
        if name.split(".")[0] in ("vllm_ascend", "vllm"):
            del sys.modules[name]


def spy_on_create_custom_proposer(monkeypatch) -> list:
    import vllm.v1.spec_decode.custom_class_proposer as hook
    calls, real = [], hook.create_custom_proposer

    def create_custom_proposer(vllm_config):
        calls.append(vllm_config)
        return real(vllm_config)

    monkeypatch.setattr(hook, "create_custom_proposer", create_custom_proposer)
    return calls


def vllm_config(method: str = "custom_class", k: int = 3):
    return SimpleNamespace(speculative_config=SimpleNamespace(method=method, model="hyspec.vllm.HyspecProposer",
                                                              num_speculative_tokens=k),
                           model_config=SimpleNamespace(max_model_len=64))


def input_batch(rows: list[list[int]], batch_class):
    counts, ids = input_arrays(rows)
    return batch_class(num_tokens_no_spec=counts, token_ids_cpu=ids, num_prompt_tokens=np.full(len(rows), 4),
                       req_ids=[f"req-{i}" for i in range(len(rows))])


def hooks() -> list:
    return [f for f in sys.meta_path if isinstance(f, plugin.PatchOnImport)]


# ---------------------------------------------------------------- (b) the patch on a v0.23.0-shaped fake


def test_the_fake_is_shaped_as_the_record(site):
    write_fake_vllm_ascend(site, SHAPES)
    assert read_shapes(site) == SHAPES


def test_custom_class_drafts_through_vllm_ascends_runner_as_through_vllms(site, monkeypatch):
    write_fake_vllm_ascend(site, SHAPES)
    created = spy_on_create_custom_proposer(monkeypatch)
    plugin.register()
    assert "vllm_ascend.worker.model_runner_v1" not in sys.modules  # patched when vLLM's worker imports it
    from vllm_ascend.worker.model_runner_v1 import NPUModelRunner
    from vllm_ascend.worker.npu_input_batch import NPUInputBatch

    config = vllm_config()
    rows = [REPEATING, [3, 4], REPEATING]
    runner = NPUModelRunner(config, input_batch(rows, NPUInputBatch))
    assert created == [config]
    assert isinstance(runner.drafter, plugin.CustomClassDrafter)
    assert isinstance(runner.drafter.proposer, HyspecProposer)
    runner.load_model()
    runner._dummy_run(8)  # vllm-ascend's profiling / graph-capture run: nothing for a custom proposer
    assert runner.lifecycle == ["load_model", "_dummy_run"]
    sampled = [[7], [4], []]
    drafts = runner.propose_draft_token_ids(sampled, None, None, None, None, None, 3, None)
    batch = input_batch(rows, NPUInputBatch)
    assert drafts == HyspecProposer(config).propose(sampled, batch.num_tokens_no_spec, batch.token_ids_cpu)
    assert drafts[0] and drafts[1] == [] and drafts[2] == []
    # the proposer was handed the runner's rows' request ids, as vLLM's runner hands them over
    assert runner.drafter.proposer.stats["steps_without_request_ids"] == 0
    with pytest.raises(TypeError, match="list of rows"):
        runner.propose_draft_token_ids(np.array([[7]]), None, None, None, None, None, 1, None)


def test_other_methods_still_reach_vllm_ascends_own_code(site, monkeypatch):
    write_fake_vllm_ascend(site, SHAPES)
    created = spy_on_create_custom_proposer(monkeypatch)
    plugin.register()
    from vllm_ascend.worker.model_runner_v1 import NPUModelRunner
    from vllm_ascend.worker.npu_input_batch import NPUInputBatch

    runner = NPUModelRunner(vllm_config("ngram"), input_batch([REPEATING], NPUInputBatch))
    assert runner.drafter[0] == "ngram drafter" and created == []
    with pytest.raises(ValueError, match="Unknown speculative decoding method: ngram"):  # the fake's own body
        runner.propose_draft_token_ids([[7]], None, None, None, None, None, 1, None)
    with pytest.raises(ValueError, match="Unknown speculative decoding method: eagle9"):
        NPUModelRunner(vllm_config("eagle9"), None)


def test_modules_imported_before_the_plugin_runs_are_patched_at_once(site, monkeypatch):
    write_fake_vllm_ascend(site, SHAPES)
    spy_on_create_custom_proposer(monkeypatch)
    import vllm_ascend.worker.model_runner_v1 as runner_module
    from vllm_ascend.worker.npu_input_batch import NPUInputBatch

    plugin.register()
    runner = runner_module.NPUModelRunner(vllm_config(), input_batch([REPEATING], NPUInputBatch))
    assert isinstance(runner.drafter, plugin.CustomClassDrafter)


@pytest.mark.parametrize("imported_first", [False, True])
def test_registering_again_patches_nothing_twice(site, monkeypatch, imported_first):
    """vLLM calls general plugins once per process, but a process may be handed the plugin twice (tests,
    a second engine in one process): one hook, and each function wrapped once."""
    write_fake_vllm_ascend(site, SHAPES)
    if imported_first:
        import vllm_ascend.worker.model_runner_v1  # noqa: F401
    plugin.register()
    plugin.register()
    import vllm_ascend.spec_decode as factory_module
    import vllm_ascend.worker.model_runner_v1 as runner_module
    plugin.register()
    assert len(hooks()) == 1
    for function in (factory_module.get_spec_decode_method, runner_module.get_spec_decode_method,
                     runner_module.NPUModelRunner.propose_draft_token_ids):
        assert getattr(function, plugin.PATCHED)
        assert not getattr(function.__wrapped__, plugin.PATCHED, False)
    assert runner_module.get_spec_decode_method is factory_module.get_spec_decode_method


def test_a_vllm_ascend_that_has_the_branch_is_left_alone(site, caplog):
    write_fake_vllm_ascend(site, SHAPES, version="0.27.0", branch=True)
    plugin.register()
    assert hooks() == []
    import vllm_ascend.worker.model_runner_v1 as runner_module
    assert not hasattr(runner_module.get_spec_decode_method, plugin.PATCHED)
    assert not hasattr(runner_module.NPUModelRunner.propose_draft_token_ids, plugin.PATCHED)
    assert runner_module.NPUModelRunner(vllm_config(), None).drafter[0] == "their own"


def test_without_vllm_ascend_the_plugin_does_nothing_and_says_nothing(site, caplog):
    caplog.set_level(logging.DEBUG, logger=plugin.__name__)
    assert plugin.source_root() is None
    plugin.register()
    assert hooks() == [] and caplog.records == []


def test_the_switch_turns_the_plugin_off(site, monkeypatch):
    write_fake_vllm_ascend(site, SHAPES)
    monkeypatch.setenv(plugin.SWITCH_ENV, "off")
    plugin.register()
    assert hooks() == []


# ---------------------------------------------------------------- (c) a differently shaped vllm-ascend


def renamed_dispatch_parameter() -> dict:
    shapes = json.loads(json.dumps(SHAPES))
    shapes["functions"][DISPATCH_KEY][1] = "sampled_token_ids"
    return shapes


def factory_without_runner() -> dict:
    shapes = json.loads(json.dumps(SHAPES))
    shapes["functions"][FACTORY_KEY] = ["method", "vllm_config", "device"]
    return shapes


@pytest.mark.parametrize("shapes, what", [(renamed_dispatch_parameter(), "propose_draft_token_ids"),
                                          (factory_without_runner(), "get_spec_decode_method")])
def test_a_differently_shaped_vllm_ascend_is_refused_by_version_and_nothing_is_patched(site, shapes, what, caplog):
    write_fake_vllm_ascend(site, shapes, version="0.26.0")
    assert differences(read_shapes(site), SHAPES)
    with pytest.raises(plugin.VllmAscendMismatch) as refused:
        plugin.check(site)
    message = str(refused.value)
    with caplog.at_level(logging.WARNING):
        plugin.register()  # vLLM keeps starting: only custom_class is unavailable, and the log says why
    assert message in caplog.text
    assert "vllm-ascend v0.23.0" in message and "installed vllm-ascend 0.26.0" in message
    assert "vllm-ascend==0.23.0" in message and RECORD["commit"][:12] in message and what in message
    assert hooks() == []
    import vllm_ascend.worker.model_runner_v1 as runner_module
    assert not hasattr(runner_module.get_spec_decode_method, plugin.PATCHED)
    assert not hasattr(runner_module.NPUModelRunner.propose_draft_token_ids, plugin.PATCHED)


def test_a_vllm_ascend_missing_a_file_is_refused(site):
    write_fake_vllm_ascend(site, SHAPES, version="0.30.0")
    (site / INPUT_BATCH).unlink()
    with pytest.raises(plugin.VllmAscendMismatch, match="(?s)0.30.0.*NPUInputBatch.__init__: no num_tokens_no_spec"):
        plugin.check(site)
    plugin.register()
    assert hooks() == []


# ---------------------------------------------------------------- the entry point


def test_pyproject_declares_the_general_plugin():
    import tomllib
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    plugins = pyproject["project"]["entry-points"]["vllm.general_plugins"]
    assert plugins == {"hyspec_ascend": "hyspec.vllm.ascend_plugin:register"}


# ---------------------------------------------------------------- inside the real vLLM (HYSPEC_VLLM_PYTHON)

VLLM_PYTHON = os.environ.get(PYTHON_ENV)
ENTRY = "hyspec.vllm.ascend_plugin:register"
INSIDE_VLLM = textwrap.dedent('''\
    import sys, importlib.metadata as md
    sys.path.insert(0, sys.argv[1])
    from types import SimpleNamespace
    import numpy as np
    from vllm.plugins import load_general_plugins
    assert any(e.value == "{entry}" for e in md.entry_points(group="vllm.general_plugins"))
    load_general_plugins()  # what each vLLM process does at start-up
    loaded = "hyspec.vllm.ascend_plugin" in sys.modules  # vLLM imported and called the entry point
    from hyspec.vllm import ascend_plugin
    hooked = any(isinstance(f, ascend_plugin.PatchOnImport) for f in sys.meta_path)
    if sys.argv[2] == "plain":
        print("loaded" if loaded else "not loaded", "hooked" if hooked else "untouched")
        raise SystemExit(0)
    from vllm_ascend.worker.model_runner_v1 import NPUModelRunner
    from vllm_ascend.worker.npu_input_batch import NPUInputBatch
    config = SimpleNamespace(speculative_config=SimpleNamespace(method="custom_class", num_speculative_tokens=3,
                                                                model="hyspec.vllm.HyspecProposer"),
                             model_config=SimpleNamespace(max_model_len=64))
    rows = [{rows}]
    ids = np.zeros((1, 64), dtype=np.int32); ids[0, :len(rows[0])] = rows[0]
    batch = NPUInputBatch(num_tokens_no_spec=np.array([len(rows[0])]), token_ids_cpu=ids,
                          num_prompt_tokens=np.array([4]), req_ids=["a"])
    runner = NPUModelRunner(config, batch)
    runner.load_model(); runner._dummy_run(8)
    print(type(runner.drafter.proposer).__name__, runner.propose_draft_token_ids([[7]], *[None] * 5, 1, None))
    ''').format(entry=ENTRY, rows=REPEATING)


@pytest.mark.skipif(not VLLM_PYTHON, reason=f"{PYTHON_ENV} is not set (scripts/vllm_venv.sh builds it)")
@pytest.mark.parametrize("case", ["plain", "fake vllm-ascend"])
def test_vllms_own_plugin_loader_runs_the_entry_point(tmp_path, case):
    """vLLM's load_general_plugins in its own venv: without vllm_ascend the plugin does nothing; with the fake
    v0.23.0-shaped vllm_ascend the runner drafts through vLLM's real create_custom_proposer.  Where the vLLM
    venv's hyspec was installed before the entry point existed, a dist-info in the tmp dir declares it."""
    if case != "plain":
        write_fake_vllm_ascend(tmp_path, SHAPES)
    lookup = (f"import importlib.metadata as md; print(any(e.value == '{ENTRY}' "
              "for e in md.entry_points(group='vllm.general_plugins')))")
    declared = subprocess.run([VLLM_PYTHON, "-c", lookup], capture_output=True, text=True,
                              check=True).stdout.strip() == "True"
    if not declared:
        probe = tmp_path / "hyspec_entry_probe-0.dist-info"
        probe.mkdir()
        (probe / "METADATA").write_text("Metadata-Version: 2.1\nName: hyspec_entry_probe\nVersion: 0\n")
        (probe / "entry_points.txt").write_text(f"[vllm.general_plugins]\nhyspec_ascend = {ENTRY}\n")
    run = subprocess.run([VLLM_PYTHON, "-c", INSIDE_VLLM, str(tmp_path), "plain" if case == "plain" else "fake"],
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    last = run.stdout.strip().splitlines()[-1]
    if case == "plain":
        assert last == "loaded untouched"
    else:
        expected = HyspecProposer(vllm_config()).propose([[7]], *input_arrays([REPEATING]))
        assert last == f"HyspecProposer {expected}" and expected[0]


def input_arrays(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    ids = np.zeros((len(rows), 64), dtype=np.int32)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = row
    return np.array([len(r) for r in rows], dtype=np.int32), ids


# ---------------------------------------------------------------- the first-contact check (hyspec.vllm.ascend_check)


def test_the_first_contact_check_reports_the_patch_in_force(site, capsys):
    from hyspec.vllm import ascend_check
    assert ascend_check.patch_report()["state"] == "absent"
    write_fake_vllm_ascend(site, SHAPES)
    assert ascend_check.main([]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["state"] == "patched" and report["vllm_ascend"] == "0.23.0"
    assert list(report["patched"].values()) == [True, True, True]


def test_the_first_contact_check_reports_a_mismatch_and_fails(site, capsys):
    from hyspec.vllm import ascend_check
    write_fake_vllm_ascend(site, renamed_dispatch_parameter(), version="0.26.0")
    assert ascend_check.main([]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["state"] == "mismatch" and "vllm-ascend==0.23.0" in report["error"]
