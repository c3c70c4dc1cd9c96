"""What the host CPU is: vendor, model, cores and the ISA flags hyspec's CPU paths use.

Linux: parsed from /proc/cpuinfo.  x86 kernels list ``vendor_id``, ``model
name`` and ``flags``; arm64 kernels list ``CPU implementer`` / ``CPU part``
codes and ``Features`` instead (NEON is spelled ``asimd`` there).  Elsewhere
(macOS, Windows) the facts come from ``sysctl`` or ``platform``, and what they
cannot tell is listed in ``unknown_fields`` instead of being guessed.
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from hyspec.backends.records import ARM_ISA_FLAGS, X86_ISA_FLAGS, IsaFlags

PROC_CPUINFO = Path("/proc/cpuinfo")

X86_VENDORS = {"GenuineIntel": "Intel", "AuthenticAMD": "AMD", "HygonGenuine": "Hygon"}

# arm64 "CPU implementer" codes (Linux arch/arm64/include/asm/cputype.h)
ARM_IMPLEMENTERS = {
    0x41: "Arm", 0x42: "Broadcom", 0x43: "Cavium", 0x46: "Fujitsu", 0x48: "HiSilicon",
    0x4E: "NVIDIA", 0x50: "Applied Micro", 0x51: "Qualcomm", 0x61: "Apple", 0x6D: "Microsoft",
    0xC0: "Ampere",
}
# (implementer, part) -> core name, for the server cores hyspec meets
ARM_PARTS = {
    (0x41, 0xD0C): "Neoverse-N1", (0x41, 0xD40): "Neoverse-V1", (0x41, 0xD49): "Neoverse-N2",
    (0x41, 0xD4F): "Neoverse-V2", (0x41, 0xD8E): "Neoverse-N3", (0x41, 0xD84): "Neoverse-V3",
    (0x41, 0xD08): "Cortex-A72", (0x41, 0xD0B): "Cortex-A76", (0x48, 0xD01): "Kunpeng-920",
    (0x48, 0xD02): "Kunpeng-930", (0xC0, 0xAC3): "AmpereOne",
}
# kernel feature name -> hyspec's name for it
ARM_FEATURE_ALIASES = {"asimd": "neon"}


@dataclass(frozen=True)
class CpuFacts:
    """The host CPU as read from one source; ``None`` means the source could not tell."""

    arch: str
    vendor: str | None
    model_name: str | None
    physical_cores: int | None
    logical_cores: int | None
    isa: IsaFlags
    source: str  # "/proc/cpuinfo", "sysctl" or "platform"

    @property
    def unknown_fields(self) -> tuple[str, ...]:
        names = ("vendor", "model_name", "physical_cores", "logical_cores")
        unknown = [n for n in names if getattr(self, n) is None]
        if not self.isa.known:
            unknown.append("isa")
        return tuple(unknown)


def isa_family(arch: str) -> str:
    arch = arch.lower()
    if arch in ("x86_64", "amd64", "i386", "i686", "x86"):
        return "x86"
    if arch.startswith(("aarch64", "arm")):
        return "arm"
    return "other"


def isa_flags(family: str, kernel_flags: set[str] | None) -> IsaFlags:
    """The flags hyspec cares about out of everything the kernel lists (None: unknown)."""
    checked = {"x86": X86_ISA_FLAGS, "arm": ARM_ISA_FLAGS}.get(family, ())
    if kernel_flags is None:
        return IsaFlags(family=family, checked=checked, present=frozenset(), known=False)
    names = {ARM_FEATURE_ALIASES.get(f, f) for f in kernel_flags} if family == "arm" else kernel_flags
    return IsaFlags(family=family, checked=checked, present=frozenset(names & set(checked)), known=True)


def _split_processors(text: str) -> list[dict[str, str]]:
    """One dict per blank-line separated block of ``key : value`` lines."""
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        key, sep, value = line.partition(":")
        if sep:
            current[key.strip()] = value.strip()
    if current:
        blocks.append(current)
    return blocks


def _hex(value: str | None) -> int | None:
    try:
        return int(value, 16) if value else None
    except ValueError:
        return None


def parse_cpuinfo(text: str, arch: str | None = None) -> CpuFacts:
    """Parse the text of /proc/cpuinfo.  ``arch`` defaults to what the text says it is."""
    blocks = _split_processors(text)
    cpus = [b for b in blocks if "processor" in b and b["processor"].isdigit()]
    if not cpus:
        raise ValueError("no 'processor' entries found: not the text of /proc/cpuinfo")
    first = cpus[0]
    if arch is None:
        arch = "aarch64" if "CPU implementer" in first else "x86_64" if "vendor_id" in first else platform.machine()
    family = isa_family(arch)
    logical = len(cpus)

    if family == "arm":
        implementer, part = _hex(first.get("CPU implementer")), _hex(first.get("CPU part"))
        vendor = ARM_IMPLEMENTERS.get(implementer) if implementer is not None else None
        if vendor is None and implementer is not None:
            vendor = f"implementer 0x{implementer:02x}"
        model = first.get("model name") or ARM_PARTS.get((implementer, part))
        if model is None and part is not None:
            model = f"part 0x{part:03x}"
        features = first.get("Features")
        flags = set(features.split()) if features is not None else None
        # arm64 cpuinfo has no topology; physical cores come from sysfs (see read_cpu_facts)
        physical = None
    else:
        vendor_id = first.get("vendor_id")
        vendor = X86_VENDORS.get(vendor_id, vendor_id) if vendor_id else None
        model = first.get("model name")
        flag_text = first.get("flags")
        flags = set(flag_text.split()) if flag_text is not None else None
        cores = {(c.get("physical id"), c.get("core id")) for c in cpus}
        physical = len(cores) if all(c.get("core id") is not None for c in cpus) else None

    return CpuFacts(arch=arch, vendor=vendor, model_name=model, physical_cores=physical,
                    logical_cores=logical, isa=isa_flags(family, flags), source="/proc/cpuinfo")


def physical_cores_from_sysfs(root: Path = Path("/sys/devices/system/cpu")) -> int | None:
    """Distinct SMT sibling sets = physical cores (Linux sysfs topology), or None."""
    siblings = set()
    for f in root.glob("cpu[0-9]*/topology/thread_siblings_list"):
        try:
            siblings.add(f.read_text().strip())
        except OSError:
            return None
    return len(siblings) or None


def _run_sysctl(key: str) -> str | None:
    """``sysctl -n key``, or None when sysctl or the key does not exist."""
    exe = shutil.which("sysctl")
    if exe is None:
        return None
    try:
        result = subprocess.run([exe, "-n", key], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    value = result.stdout.strip()
    return value if result.returncode == 0 and value else None


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def facts_from_sysctl(arch: str, sysctl: Callable[[str], str | None] = _run_sysctl) -> CpuFacts | None:
    """macOS / BSD: brand string, core counts and feature bits from sysctl; None without sysctl."""
    brand = sysctl("machdep.cpu.brand_string")
    logical = _int_or_none(sysctl("hw.logicalcpu") or sysctl("hw.ncpu"))
    if brand is None and logical is None:
        return None
    physical = _int_or_none(sysctl("hw.physicalcpu"))
    family = isa_family(arch)
    flags: set[str] | None = None
    if family == "x86":
        text = " ".join(filter(None, (sysctl("machdep.cpu.features"), sysctl("machdep.cpu.leaf7_features"))))
        if text:
            # "AVX512F AVX512VNNI ..." -> compare without case or underscores
            listed = {t.lower().replace("_", "").replace(".", "") for t in text.split()}
            flags = {f for f in X86_ISA_FLAGS if f.replace("_", "") in listed}
    elif family == "arm":
        keys = {"neon": ("hw.optional.neon", "hw.optional.AdvSIMD"), "bf16": ("hw.optional.arm.FEAT_BF16",),
                "sve": ("hw.optional.arm.FEAT_SVE",), "sve2": ("hw.optional.arm.FEAT_SVE2",)}
        answers = {name: next((v for v in map(sysctl, ks) if v is not None), None) for name, ks in keys.items()}
        if any(v is not None for v in answers.values()):
            # a key the OS does not know means the feature does not exist there
            flags = {name for name, v in answers.items() if v == "1"}
    vendor = "Apple" if brand and brand.startswith("Apple") else ("Intel" if brand and "Intel" in brand else None)
    return CpuFacts(arch=arch, vendor=vendor, model_name=brand, physical_cores=physical, logical_cores=logical,
                    isa=isa_flags(family, flags), source="sysctl")


def facts_from_platform(arch: str) -> CpuFacts:
    """Last resort: what the standard library knows (no ISA flags, no physical core count)."""
    return CpuFacts(arch=arch, vendor=None, model_name=platform.processor() or None, physical_cores=None,
                    logical_cores=os.cpu_count(), isa=isa_flags(isa_family(arch), None), source="platform")


def read_cpu_facts(
    cpuinfo_path: Path | None = None,
    sysctl: Callable[[str], str | None] | None = None,
) -> CpuFacts:
    """The host CPU: /proc/cpuinfo where it exists, else sysctl, else platform."""
    path = PROC_CPUINFO if cpuinfo_path is None else cpuinfo_path
    sysctl = _run_sysctl if sysctl is None else sysctl
    arch = platform.machine() or "unknown"
    try:
        text = path.read_text(errors="replace")
    except OSError:
        text = None
    if text is not None:
        facts = parse_cpuinfo(text, arch=arch)
        if facts.physical_cores is None:
            facts = replace(facts, physical_cores=physical_cores_from_sysfs())
        return facts
    return facts_from_sysctl(arch, sysctl) or facts_from_platform(arch)


def usable_cores() -> int | None:
    """CPUs this process may run on (sched affinity where the OS has it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count()
