"""Shared test set-up: one intra-op thread per test process.

Test models are tiny: a second thread only adds synchronisation, and with two
test processes on two cores (pytest -n 2) a second thread each oversubscribes
the box, which made torch ops up to 30x slower here.
"""
from __future__ import annotations

import os

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

import torch  # noqa: E402

torch.set_num_threads(1)
