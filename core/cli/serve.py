"""Not built yet: filled in by the hybrid dispatcher and serving issue."""
from __future__ import annotations

import argparse

from hyspec.cli._unbuilt import not_built


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    return not_built("serve", "the hybrid dispatcher and serving issue")
