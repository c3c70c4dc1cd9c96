"""CPU facts from /proc/cpuinfo samples (x86 "flags", arm64 "Features"), sysctl and platform fallbacks, memory."""
from __future__ import annotations

from pathlib import Path

import pytest

from hyspec.backends import cpuinfo, meminfo
from hyspec.backends.cpuinfo import facts_from_sysctl, parse_cpuinfo, read_cpu_facts
from hyspec.backends.meminfo import HostMemory, cgroup_limit, parse_meminfo

SAMPLES = Path(__file__).parent / "data" / "cpuinfo"


def sample(name: str):
    return parse_cpuinfo((SAMPLES / name).read_text())


def test_sapphire_rapids_has_avx512_and_amx():
    facts = sample("intel_sapphire_rapids.txt")
    assert (facts.vendor, facts.model_name) == ("Intel", "Intel(R) Xeon(R) Platinum 8480+")
    assert facts.isa.family == "x86" and facts.isa.known
    assert facts.isa.to_dict() == {"avx2": True, "avx512f": True, "avx512_bf16": True, "avx512_vnni": True,
                                   "amx_tile": True, "amx_bf16": True, "amx_int8": True}
    # 2 cores x 2 hyper-threads: (physical id, core id) pairs tell them apart
    assert (facts.physical_cores, facts.logical_cores) == (2, 4)
    assert facts.unknown_fields == ()


def test_zen4_has_avx512_but_no_amx():
    facts = sample("amd_zen4_genoa.txt")
    assert facts.vendor == "AMD" and facts.model_name.startswith("AMD EPYC 9654")
    isa = facts.isa.to_dict()
    assert isa["avx2"] and isa["avx512f"] and isa["avx512_bf16"] and isa["avx512_vnni"]
    assert not (isa["amx_tile"] or isa["amx_bf16"] or isa["amx_int8"])
    assert (facts.physical_cores, facts.logical_cores) == (2, 4)


@pytest.mark.parametrize("name, model, sve2", [
    ("arm_neoverse_v1_graviton3.txt", "Neoverse-V1", False),
    ("arm_neoverse_v2_grace.txt", "Neoverse-V2", True),
])
def test_neoverse_reads_features_and_part_codes(name, model, sve2):
    facts = sample(name)
    assert facts.arch == "aarch64" and facts.isa.family == "arm"
    assert (facts.vendor, facts.model_name) == ("Arm", model)  # from "CPU implementer"/"CPU part"
    assert facts.isa.to_dict() == {"neon": True, "sve": True, "sve2": sve2, "bf16": True}  # neon = "asimd"
    assert facts.logical_cores == 4
    assert facts.physical_cores is None  # arm64 cpuinfo has no topology; sysfs fills it on a live box
    assert facts.isa.has("avx512f") is None  # not an Arm flag: unknown, not False


def test_kunpeng920_has_neon_without_sve():
    facts = sample("arm_kunpeng920.txt")
    assert (facts.vendor, facts.model_name) == ("HiSilicon", "Kunpeng-920")
    assert facts.isa.to_dict() == {"neon": True, "sve": False, "sve2": False, "bf16": False}


def test_this_machines_capture_matches_its_flags_line():
    text = (SAMPLES / "intel_xeon_model207_vm_this_machine.txt").read_text()
    listed = set(next(line for line in text.splitlines() if line.startswith("flags")).split(":", 1)[1].split())
    facts = parse_cpuinfo(text)
    assert facts.isa.to_dict() == {flag: flag in listed for flag in facts.isa.checked}


def test_unknown_arm_part_is_named_by_its_code():
    text = "processor\t: 0\nFeatures\t: fp asimd\nCPU implementer\t: 0x41\nCPU part\t: 0xfff\n"
    facts = parse_cpuinfo(text)
    assert facts.model_name == "part 0xfff" and facts.isa.has("neon") is True


def test_text_without_processors_is_rejected():
    with pytest.raises(ValueError, match="not the text of /proc/cpuinfo"):
        parse_cpuinfo("MemTotal: 1 kB\n")


def fake_sysctl(answers):
    return lambda key: answers.get(key)


def test_macos_apple_silicon_from_sysctl():
    facts = facts_from_sysctl("arm64", fake_sysctl({
        "machdep.cpu.brand_string": "Apple M2 Pro", "hw.logicalcpu": "12", "hw.physicalcpu": "12",
        "hw.optional.neon": "1", "hw.optional.arm.FEAT_BF16": "1"}))
    assert (facts.source, facts.vendor, facts.model_name) == ("sysctl", "Apple", "Apple M2 Pro")
    assert facts.isa.to_dict() == {"neon": True, "sve": False, "sve2": False, "bf16": True}
    assert facts.unknown_fields == ()


def test_macos_intel_from_sysctl_feature_lists():
    facts = facts_from_sysctl("x86_64", fake_sysctl({
        "machdep.cpu.brand_string": "Intel(R) Core(TM) i9-9980HK CPU @ 2.40GHz", "hw.logicalcpu": "16",
        "hw.physicalcpu": "8", "machdep.cpu.features": "FPU SSE SSE2 AVX1.0",
        "machdep.cpu.leaf7_features": "BMI1 AVX2 BMI2"}))
    assert facts.vendor == "Intel" and facts.physical_cores == 8
    assert facts.isa.has("avx2") is True and facts.isa.has("avx512f") is False


def test_no_proc_cpuinfo_and_no_sysctl_says_what_is_unknown(tmp_path):
    facts = read_cpu_facts(cpuinfo_path=tmp_path / "missing", sysctl=fake_sysctl({}))
    assert facts.source == "platform"
    assert {"physical_cores", "isa"} <= set(facts.unknown_fields)
    assert all(v is None for v in facts.isa.to_dict().values())


def test_live_read_uses_proc_cpuinfo_and_sysfs():
    if not cpuinfo.PROC_CPUINFO.exists():
        pytest.skip("no /proc/cpuinfo on this OS")
    facts = read_cpu_facts()
    assert facts.source == "/proc/cpuinfo" and facts.logical_cores >= 1


MEMINFO = "MemTotal:       24684092 kB\nMemFree:         1000000 kB\nMemAvailable:   20520028 kB\nCached: 5 kB\n"


def test_meminfo_in_bytes():
    mem = parse_meminfo(MEMINFO)
    assert mem == HostMemory(total_bytes=24684092 * 1024, available_bytes=20520028 * 1024)


def test_old_kernel_without_memavailable_uses_free_plus_cache():
    mem = parse_meminfo("MemTotal: 100 kB\nMemFree: 10 kB\nCached: 30 kB\n")
    assert mem.available_bytes == 40 * 1024


def test_cgroup_limit_caps_host_memory(tmp_path, monkeypatch):
    (tmp_path / "meminfo").write_text(MEMINFO)
    (tmp_path / "memory.max").write_text("4294967296\n")
    (tmp_path / "memory.current").write_text("1073741824\n")
    monkeypatch.setattr(meminfo, "CGROUP_LIMITS", ((tmp_path / "memory.max", tmp_path / "memory.current"),))
    mem = meminfo.host_memory(tmp_path / "meminfo")
    assert mem == HostMemory(total_bytes=4 << 30, available_bytes=3 << 30)


def test_cgroup_without_limit_is_ignored(tmp_path):
    (tmp_path / "memory.max").write_text("max\n")
    assert cgroup_limit(((tmp_path / "memory.max", tmp_path / "memory.current"),)) is None
