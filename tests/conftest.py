"""Shared test set-up: small thread counts (tests run two at a time on two cores)."""
from __future__ import annotations

import os

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

import torch  # noqa: E402

torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)
