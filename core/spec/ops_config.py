"""The operator's sections of ``speculative_config``: drafters under memory pressure, and the TTFT SLO.

Both change *when* hyspec speculates, never what it outputs: a released drafter or a
breached SLO makes steps plain, and plain decoding is the reference every method equals.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hyspec.spec import _config_check as chk
from hyspec.spec._config_check import ROOT, key


@chk.document
@dataclass(frozen=True)
class MemoryPressureConfig:
    """Drafters that step aside when the KV pool runs short (residency.py).

    Pressure is: waiting requests the pool could not admit, a preemption, or free pages under
    `free_floor` -- held for `window_s`.  Then the least useful drafter (lowest measured goodput)
    releases its weights and KV pages and its steps decode plainly; it is reloaded once pressure
    has stayed away for `cooldown_s`.
    """

    _SECTION: ClassVar[str] = f"{ROOT}.memory_pressure"
    enabled: bool = key(True, "Release drafters under KV pressure (false: drafters always stay loaded).")
    free_floor: float = key(0.05, "Fraction of KV pages that must stay free, in [0, 1); below it is pressure.")
    window_s: float = key(5.0, "Seconds pressure must last before a drafter is released (> 0).")
    cooldown_s: float = key(90.0, "Seconds without pressure before a released drafter is reloaded (> 0); "
                                  "a failed reload retries after another cool-down.")

    def __post_init__(self) -> None:
        chk.check_bool(self, "enabled")
        chk.check_float(self, "free_floor", 0.0, 0.99)
        chk.check_float(self, "window_s", 0.0, 86_400.0, lo_open=True)
        chk.check_float(self, "cooldown_s", 0.0, 86_400.0, lo_open=True)


@chk.document
@dataclass(frozen=True)
class SLOConfig:
    """Service-level objectives that switch speculation off while they are breached (slo.py).

    TTFT: the p99 time to first token of the requests that finished in the last `window_s`
    seconds.  Above `ttft_p99_ms` every step decodes plainly (a speculative step is longer, and
    prompts waiting for their first token share it); speculation resumes under
    `resume_fraction` x `ttft_p99_ms`.
    """

    _SECTION: ClassVar[str] = f"{ROOT}.slo"
    ttft_p99_ms: float | None = key(None, "TTFT p99 ceiling in ms (e.g. 300); null = no TTFT objective.")
    window_s: float = key(60.0, "Sliding window the p99 is taken over, in seconds (> 0).")
    min_samples: int = key(20, "Finished requests in the window before the p99 is judged (>= 1).")
    resume_fraction: float = key(0.8, "Speculation resumes when the p99 falls under this fraction of the "
                                      "ceiling, in (0, 1).")

    def __post_init__(self) -> None:
        chk.check_float(self, "ttft_p99_ms", 0.0, 3_600_000.0, lo_open=True, optional=True)
        chk.check_float(self, "window_s", 0.0, 86_400.0, lo_open=True)
        chk.check_int(self, "min_samples", 1, 1_000_000)
        chk.check_float(self, "resume_fraction", 0.0, 1.0, lo_open=True)
        if self.resume_fraction >= 1.0:
            chk.fail(self, "resume_fraction", f"must be < 1 (hysteresis), got {self.resume_fraction}")
