"""vLLM's ``custom_class`` speculative method for vllm-ascend releases that lack it (v0.23.0 and its kind).

vLLM's GPU runner builds a ``custom_class`` drafter with ``create_custom_proposer(vllm_config)`` and each step
calls ``drafter.propose(sampled_token_ids, input_batch.num_tokens_no_spec, input_batch.token_ids_cpu,
slot_mappings=...)``.  vllm-ascend v0.23.0's runner (``vllm_ascend/worker/model_runner_v1.py``) has neither:
its factory ``vllm_ascend.spec_decode.get_spec_decode_method`` raises "Unknown speculative decoding method"
(upstream PR vllm-project/vllm-ascend#15710 adds the branch).  This module, a ``vllm.general_plugins``
entry point that vLLM calls in each of its processes, adds both halves:

- the factory builds vLLM's ``create_custom_proposer(vllm_config)`` and wraps it in ``CustomClassDrafter``,
  which also answers the two calls vllm-ascend's runner makes on every drafter (``load_model(model)``,
  ``dummy_run(...)``);
- the runner's ``propose_draft_token_ids`` calls the proposer's ``propose`` with vLLM's arguments, from the
  runner's own method as vLLM does (hyspec's proposer reads the rows' request ids from its caller's input
  batch).  vllm-ascend's runner holds no slot mappings at that point: ``slot_mappings`` is None (hyspec's
  proposer does not read it).

When it patches: vllm_ascend not installed, or its source already has the branch: nothing.  Otherwise the
installed source is read (``hyspec.vllm.ascend_shapes``, no import) and compared with the committed record of
v0.23.0; any difference is an error naming that version, before anything is patched.  The modules are
patched when vLLM's worker first imports them (an import hook), so processes that never build a model
runner (the API server) never import vllm-ascend's runner for us.  ``HYSPEC_VLLM_ASCEND=off`` turns the
plugin off.  It has not run on an NPU (scripts/npu_first_contact.sh checks it there).
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.metadata
import importlib.util
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from hyspec.vllm.ascend_shapes import RUNNER_CLASS, differences, load_record, read_shapes

logger = logging.getLogger(__name__)

SWITCH_ENV = "HYSPEC_VLLM_ASCEND"
FACTORY_MODULE = "vllm_ascend.spec_decode"
RUNNER_MODULE = "vllm_ascend.worker.model_runner_v1"
FACTORY = "get_spec_decode_method"
DISPATCH = "propose_draft_token_ids"
CUSTOM_PROPOSER_MODULE = "vllm.v1.spec_decode.custom_class_proposer"
PATCHED = "__hyspec_custom_class__"  # set on each function this module installs (idempotence)


class VllmAscendMismatch(RuntimeError):
    """The installed vllm-ascend is not shaped as the plugin's record says; nothing was patched."""


class CustomClassDrafter:
    """A vLLM ``custom_class`` proposer as vllm-ascend's runner drives a drafter (the patched dispatch calls
    ``proposer.propose`` itself)."""

    def __init__(self, proposer: Any):
        self.proposer = proposer

    def load_model(self, model: Any, *args: Any, **kwargs: Any) -> None:
        # optional in vLLM's contract: its runner calls it only when the proposer has it
        load = getattr(self.proposer, "load_model", None)
        if load is not None:
            load(model)

    def dummy_run(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: vLLM never warms a custom proposer up; vllm-ascend's profiling and graph-capture runs call
        this on every drafter (a model drafter runs its forward here)."""


def with_custom_class(original: Callable) -> Callable:
    """vllm-ascend's drafter factory plus the ``custom_class`` branch (same parameters as v0.23.0's)."""

    @functools.wraps(original)
    def get_spec_decode_method(method, vllm_config, device, runner):
        if method == "custom_class":
            from vllm.v1.spec_decode.custom_class_proposer import create_custom_proposer
            return CustomClassDrafter(create_custom_proposer(vllm_config))
        return original(method, vllm_config, device, runner)

    setattr(get_spec_decode_method, PATCHED, True)
    return get_spec_decode_method


def with_custom_dispatch(original: Callable) -> Callable:
    """The runner's draft dispatch plus the ``custom_class`` drafter, called as vLLM's GPU runner calls it."""

    @functools.wraps(original)
    def propose_draft_token_ids(self, valid_sampled_token_ids, *args, **kwargs):
        if not isinstance(getattr(self, "drafter", None), CustomClassDrafter):
            return original(self, valid_sampled_token_ids, *args, **kwargs)
        # custom_class is not a padded-batch method, so the runner hands over the CPU rows (as for ngram)
        if not isinstance(valid_sampled_token_ids, list):
            raise TypeError(f"custom_class drafting needs the sampled tokens as a list of rows, got "
                            f"{type(valid_sampled_token_ids).__name__}")
        # called from here, as vLLM's runner calls it from its own propose_draft_token_ids: hyspec's proposer
        # reads the request ids of the rows from its caller's input batch (hyspec.vllm.requests)
        batch = self.input_batch
        return self.drafter.proposer.propose(valid_sampled_token_ids, batch.num_tokens_no_spec, batch.token_ids_cpu,
                                             slot_mappings=None)

    setattr(propose_draft_token_ids, PATCHED, True)
    return propose_draft_token_ids


def patch_factory_module(module: ModuleType) -> None:
    factory = getattr(module, FACTORY)
    if not getattr(factory, PATCHED, False):
        setattr(module, FACTORY, with_custom_class(factory))


def patch_runner_module(module: ModuleType) -> None:
    """The runner class's dispatch, and the factory name its module imported (``_get_drafter`` looks it up)."""
    runner = getattr(module, RUNNER_CLASS)
    dispatch = runner.__dict__[DISPATCH]
    factory = getattr(module, FACTORY)
    if not getattr(factory, PATCHED, False):  # imported before the factory module was patched
        patched = getattr(sys.modules.get(FACTORY_MODULE), FACTORY, None)
        same = getattr(patched, PATCHED, False) and patched.__wrapped__ is factory
        factory = patched if same else with_custom_class(factory)
    if not getattr(dispatch, PATCHED, False):
        dispatch = with_custom_dispatch(dispatch)
    # both names exist (checked above): assign together, so a runner module is patched whole or not at all
    setattr(module, FACTORY, factory)
    setattr(runner, DISPATCH, dispatch)


PATCHES: dict[str, Callable[[ModuleType], None]] = {FACTORY_MODULE: patch_factory_module,
                                                     RUNNER_MODULE: patch_runner_module}


class _ThenPatch(importlib.abc.Loader):
    """A module's own loader, then the patch, before anyone else sees the module."""

    def __init__(self, loader: importlib.abc.Loader, patch: Callable[[ModuleType], None]):
        self._loader, self._patch = loader, patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._patch(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ... for inspect and tracebacks
        return getattr(self._loader, name)


class PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches the vllm-ascend modules in ``PATCHES`` as they are imported."""

    def find_spec(self, fullname: str, path: Any, target: Any = None):
        patch = PATCHES.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ThenPatch(spec.loader, patch)
                return spec
        return None


def installed_version() -> str:
    try:
        return importlib.metadata.version("vllm_ascend")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def source_root() -> Path | None:
    """The folder holding the installed ``vllm_ascend/`` (None: not installed), found without importing it."""
    spec = importlib.util.find_spec("vllm_ascend")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


def has_custom_proposer_hook() -> bool:
    """Whether the installed vLLM has ``create_custom_proposer`` (looked up, not imported)."""
    try:
        return importlib.util.find_spec(CUSTOM_PROPOSER_MODULE) is not None
    except ImportError:  # a parent package is missing
        return False


def check(root: Path) -> str:
    """``"present"`` (the branch exists) or ``"patch"``; VllmAscendMismatch when the source differs."""
    shapes = read_shapes(root)
    if shapes["custom_class_branch"]:
        return "present"
    record = load_record()
    diff = differences(shapes, record["shapes"], label=record["tag"])
    if diff:
        raise VllmAscendMismatch(
            f"hyspec's vllm-ascend plugin adds vLLM's custom_class speculative method to vllm-ascend "
            f"{record['tag']} ({record['repository']} @ {record['commit'][:12]}), and the installed vllm-ascend "
            f"{installed_version()} ({root / 'vllm_ascend'}) is shaped differently:\n  " + "\n  ".join(diff)
            + f"\nNothing was patched.  Install vllm-ascend=={record['tag'].lstrip('v')} (with vLLM "
              f"{record['vllm']}), or a vllm-ascend that has custom_class itself (PR #15710); "
              f"{SWITCH_ENV}=off turns this plugin off.")
    if not has_custom_proposer_hook():
        raise VllmAscendMismatch(f"this vLLM has no {CUSTOM_PROPOSER_MODULE} (the custom_class hook; vLLM "
                                 f"{record['vllm']}, which vllm-ascend {record['tag']} pairs with, has it)")
    return "patch"


def register() -> None:
    """The ``vllm.general_plugins`` entry point (called once per vLLM process; safe to call again)."""
    if os.environ.get(SWITCH_ENV, "").strip().lower() in ("off", "0", "false", "no"):
        return
    root = source_root()
    if root is None:  # plain vLLM: nothing to do, nothing to say
        return
    try:
        state = check(root)
    except VllmAscendMismatch as exc:
        # Warn, never stop vLLM: most users of this vLLM do not ask for custom_class, and for those who do,
        # vllm-ascend's own "Unknown speculative decoding method" follows this message in the log.
        logger.warning("%s", exc)
        return
    if state == "present":
        logger.debug("vllm-ascend %s has custom_class: hyspec's plugin leaves it alone", installed_version())
        return
    for name, patch in PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
    if not any(isinstance(finder, PatchOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, PatchOnImport())
    logger.info("hyspec: custom_class speculative decoding added to vllm-ascend %s", installed_version())
