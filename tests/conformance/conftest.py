"""The conformance suite under pytest: the same checks ``hyspec conformance`` runs, one test per op and method.

Without a CUDA device the Triton kernels run under the interpreter; triton
reads TRITON_INTERPRET when it is first imported, so it is set here, before
any test module of this folder imports it (hyspec.conformance.targets says
why, and reports the target unavailable if triton was imported earlier).
"""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hyspec.conformance.methods import Workspace  # noqa: E402
from hyspec.conformance.targets import Target, Unavailable, resolve  # noqa: E402

BACKENDS = ("cpu", "cuda", "npu")


@pytest.fixture(scope="session")
def targets() -> dict[str, Target | Unavailable]:
    return {t.name: t for t in resolve("all")}


@pytest.fixture
def target(targets, request) -> Target:
    """The backend named by the test's ``backend`` parameter; skipped with the probe's reason when absent."""
    found = targets[request.getfixturevalue("backend")]
    if isinstance(found, Unavailable):
        pytest.skip(f"{found.name} cannot run here: {found.reason}")
    return found


@pytest.fixture(scope="session")
def workspace():
    ws = Workspace.create()
    yield ws
    ws.close()


def assert_passed(result) -> None:
    """Fail with every failing case listed (a skipped check skips the test with its reason)."""
    if result.status == "skip":
        pytest.skip(result.detail)
    bad = [f"{c.dtype or ''} {c.label}: {c.status} {c.detail} (max error {c.max_error}, ratio {c.ratio})"
           for c in result.cases if c.status in ("fail", "error")]
    assert result.status == "pass", f"{result.name}: {result.status} {result.detail}\n" + "\n".join(bad)
