"""Not built yet: filled in by the foundation issue."""
from __future__ import annotations

import argparse

from hyspec.cli._unbuilt import not_built


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    return not_built("probe", "the foundation issue")
