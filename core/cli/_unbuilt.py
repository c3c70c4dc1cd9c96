"""Shared body of subcommands that later issues fill in."""
from __future__ import annotations

import sys


def not_built(command: str, issue: str) -> int:
    print(f"hyspec {command}: not built yet ({issue}).", file=sys.stderr)
    return 2
