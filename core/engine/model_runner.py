"""Moved to :mod:`hyspec.seam.forward` (issue 49's seam); this re-export keeps the old name working until the
modules that still import it (listed in pyproject.toml's import-linter ignore_imports) move to the new one.
Delete it then: nothing else may import it."""
from hyspec.seam.forward import ALL_LOGITS, LAST_LOGITS, NO_LOGITS, BatchInputs, Feed, ForwardResult, ModelRunner, build_inputs  # noqa: F401
