"""The operator's sections of ``speculative_config``: drafters under memory pressure, and the TTFT SLO.

Both change *when* hyspec speculates, never what it outputs: a released drafter or a
breached SLO makes steps plain, and plain decoding is the reference every method equals.
"""
from __future__ import annotations

from typing import Optional

from hyspec.spec._config_check import ROOT, Bool, Float, Int, key, section, section_field


@section(f"{ROOT}.memory_pressure")
class MemoryPressureConfig:
    """Drafters that step aside when the KV pool runs short (residency.py).

    Pressure is: waiting requests the pool could not admit, a preemption, or free pages under
    `free_floor` -- held for `window_s`.  Then the least useful drafter (lowest measured goodput)
    releases its weights and KV pages and its steps decode plainly; it is reloaded once pressure
    has stayed away for `cooldown_s`.
    """

    enabled: Bool = key(True, "Release drafters under KV pressure (false: drafters always stay loaded).")
    free_floor: Float = key(0.05, "Fraction of KV pages that must stay free, in [0, 1); below it is pressure.",
                            ge=0.0, le=0.99)
    window_s: Float = key(5.0, "Seconds pressure must last before a drafter is released (> 0).", gt=0.0, le=86_400.0)
    cooldown_s: Float = key(90.0, "Seconds without pressure before a released drafter is reloaded (> 0); "
                                  "a failed reload retries after another cool-down.", gt=0.0, le=86_400.0)


MemoryPressureSection = section_field(MemoryPressureConfig)


@section(f"{ROOT}.slo")
class SLOConfig:
    """Service-level objectives that switch speculation off while they are breached (slo.py).

    TTFT: the p99 time to first token of the requests that finished in the last `window_s`
    seconds.  Above `ttft_p99_ms` every step decodes plainly (a speculative step is longer, and
    prompts waiting for their first token share it); speculation resumes under
    `resume_fraction` x `ttft_p99_ms`.
    """

    ttft_p99_ms: Optional[Float] = key(None, "TTFT p99 ceiling in ms (e.g. 300); null = no TTFT objective.",
                                       gt=0.0, le=3_600_000.0)
    window_s: Float = key(60.0, "Sliding window the p99 is taken over, in seconds (> 0).", gt=0.0, le=86_400.0)
    min_samples: Int = key(20, "Finished requests in the window before the p99 is judged (>= 1).", ge=1, le=1_000_000)
    # lt=1: resuming needs the p99 to fall clearly under the ceiling (hysteresis)
    resume_fraction: Float = key(0.8, "Speculation resumes when the p99 falls under this fraction of the "
                                      "ceiling, in (0, 1).", gt=0.0, lt=1.0)


SLOSection = section_field(SLOConfig)
