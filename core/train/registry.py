"""Method name -> the module holding its training recipe (imported on demand).

The modules are the ``recipe`` of each method in the method registry
(``hyspec.spec.registry``).  Torch-free at import, so the CLI can list the
methods without loading torch.  A recipe module registers itself with
``hyspec.train.base.register_recipe`` when imported.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from hyspec.errors import HyspecError
from hyspec.spec import registry

if TYPE_CHECKING:
    from hyspec.train.base import DrafterRecipe

def resolve_recipe(method: str) -> "DrafterRecipe":
    """The registered recipe for ``method``, importing its module first if needed."""
    # hyspec.train.base brings torch: this module stays torch-free at import (module doc; pinned by
    # tests/spec/test_method_registry.py)
    from hyspec.train.base import RECIPES

    modules = registry.recipe_modules()
    if method not in modules and method not in RECIPES:
        raise HyspecError(f"unknown method {method!r}; train-draft methods: {', '.join(modules)}")
    if method not in RECIPES:
        module = modules[method]
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (module == exc.name or module.startswith(exc.name + ".")):
                raise HyspecError(f"method {method!r} is not available in this build: its recipe module "
                                  f"{module} is missing") from None
            raise HyspecError(f"the {method} recipe ({module}) cannot be imported: {exc}") from None
        except ImportError as exc:  # e.g. a name the module imports is missing: a broken build, said plainly
            raise HyspecError(f"the {method} recipe ({module}) cannot be imported: {exc}") from None
        if method not in RECIPES:
            raise HyspecError(f"method {method!r} is not available in this build: {module} was imported "
                              f"but registered no recipe for it")
    return RECIPES[method]
