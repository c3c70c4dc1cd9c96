"""Host memory as this process can use it: /proc/meminfo capped by the cgroup limit.

A container sees the host's MemTotal in /proc/meminfo but is killed at its
cgroup limit, so the KV budget must be taken from the smaller of the two.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC_MEMINFO = Path("/proc/meminfo")
# cgroup v2 first, then v1
CGROUP_LIMITS = (
    (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory.current")),
    (Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"), Path("/sys/fs/cgroup/memory/memory.usage_in_bytes")),
)
# cgroup v1 writes "no limit" as a page-rounded 2**63 - 1
_UNLIMITED = 1 << 60


@dataclass(frozen=True)
class HostMemory:
    total_bytes: int
    available_bytes: int | None  # None where the OS does not say (macOS without /proc)

    def __post_init__(self) -> None:
        if self.total_bytes <= 0:
            raise ValueError(f"total_bytes must be positive, got {self.total_bytes}")
        if self.available_bytes is not None and self.available_bytes < 0:
            raise ValueError(f"available_bytes must be >= 0, got {self.available_bytes}")


def parse_meminfo(text: str) -> HostMemory:
    """MemTotal / MemAvailable (kB in the file) as bytes."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            scale = 1024 if len(parts) > 1 and parts[1] == "kB" else 1
            values[key.strip()] = int(parts[0]) * scale
    if "MemTotal" not in values:
        raise ValueError("no MemTotal line: not the text of /proc/meminfo")
    # kernels before 3.14 have no MemAvailable; free + page cache is what it approximates
    available = values.get("MemAvailable", values.get("MemFree", 0) + values.get("Cached", 0))
    return HostMemory(total_bytes=values["MemTotal"], available_bytes=available)


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (cgroup v2 without a limit) -> None


def cgroup_limit(limits: tuple[tuple[Path, Path], ...] | None = None) -> HostMemory | None:
    """The cgroup's memory limit and what is left under it, or None without a limit."""
    for limit_path, usage_path in CGROUP_LIMITS if limits is None else limits:
        limit = _read_int(limit_path)
        if limit is not None and limit < _UNLIMITED:
            usage = _read_int(usage_path) or 0
            return HostMemory(total_bytes=limit, available_bytes=max(0, limit - usage))
    return None


def _sysconf_memory() -> HostMemory | None:
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        total = os.sysconf("SC_PHYS_PAGES") * page
    except (ValueError, OSError, AttributeError):
        return None
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * page
    except (ValueError, OSError):
        available = None  # macOS has no SC_AVPHYS_PAGES
    return HostMemory(total_bytes=total, available_bytes=available) if total > 0 else None


def host_memory(meminfo_path: Path | None = None) -> HostMemory | None:
    """Total and available host memory in bytes, or None where neither source exists."""
    path = PROC_MEMINFO if meminfo_path is None else meminfo_path
    try:
        stats = parse_meminfo(path.read_text())
    except (OSError, ValueError):
        stats = _sysconf_memory()
    if stats is None:
        return None
    limit = cgroup_limit()
    if limit is not None:
        available = limit.available_bytes if stats.available_bytes is None else min(
            stats.available_bytes, limit.available_bytes)
        stats = HostMemory(total_bytes=min(stats.total_bytes, limit.total_bytes), available_bytes=available)
    return stats
