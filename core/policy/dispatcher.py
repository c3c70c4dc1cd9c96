"""The hybrid dispatcher: which drafting method (or "none") the next step uses.

Per step, in this order:

1. the load fallback (``hyspec.policy.load``): while engaged, "none";
2. the rules, first match wins; a rule whose method is not loaded is skipped
   (filtered out once, when rules or loaded methods change, not per step);
3. when no rule matches, "none".  Plain decoding is always correct, and a
   method no rule asked for in this situation is a guess, not a decision:
   operators who want a catch-all end the file with ``{"method": "eagle"}``
   (or a preference list of when-less rules).

With ``hybrid.policy: "bandit"`` (a :class:`~hyspec.policy.bandit.BanditPolicy`)
the steps no rule matches, and those a rule hands over with ``"policy":
"bandit"``, are the bandit's: it chooses among the loaded methods and "none"
from the goodput it measured for that class of step (``observe_step``); rules
that name a method still pin it.

The canary (``hyspec.policy.canary.Canary``, the engine's one) is per
request, not per step: the engine assigns the arm once at admission, and
control-arm sequences decode plainly whatever ``choose`` says.  An engine
whose batch holds only control requests need not call ``choose`` at all.

The rule file is re-read when its stamp changes: polled from ``choose`` at
most every ``reload_interval_s`` (the stat lands on that one decision), or on
a background thread with ``watch_in_thread=True``.  A new file that does not
compile leaves the old rules in place; the error is logged and kept in
``last_reload_error``.  Reloads swap one tuple, so ``choose`` never sees a
half-installed rule set.
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter_ns
from typing import Iterable

from hyspec.errors import ConfigError
from hyspec.policy.bandit import BanditPolicy, BanditSnapshot, step_class
from hyspec.policy.conditions import Predicate
from hyspec.policy.latency import LatencyRing
from hyspec.policy.load import LoadFallback
from hyspec.policy.rules import BANDIT, Rule, RuleFileError, default_rules_path, load_rules
from hyspec.policy.signals import METHODS, NONE, StepSignals
from hyspec.policy.watch import FileStamp, PollingThread, file_stamp

log = logging.getLogger("hyspec.policy")

_NEVER = 1 << 62  # a perf_counter_ns deadline that never comes


@dataclass(frozen=True, slots=True)
class DispatchSnapshot:
    """A copy of the dispatcher's counters, for metrics and tests."""

    decisions: dict[str, int]  # steps per chosen method, "none" included
    load_fallback_active: bool
    load: float  # the load figure of the last step
    load_fallback_steps: int  # steps sent to "none" by the load fallback
    load_fallback_engagements: int  # times the fallback switched speculation off
    rules_version: int  # 1 for the rules read at start, +1 per successful reload
    reload_failures: int
    last_reload_error: str | None  # why the newest file was refused; None once a reload succeeds
    latency_p50_ns: int | None  # over the last ``latency_window`` decisions
    latency_p99_ns: int | None
    latency_samples: int
    bandit: BanditSnapshot | None = None  # the learned policy's choices and goodput, when configured


class HybridDispatcher:
    """Chooses a drafting method per step from ``StepSignals`` and JSON rules."""

    def __init__(
        self,
        rules_path: str | os.PathLike[str] | None,
        loaded_methods: Iterable[str],
        load_threshold: float = 0.75,
        load_resume_threshold: float = 0.6,
        *,
        load_signal: str = "max",
        max_batch_size: int | None = None,
        queue_capacity: int | None = None,
        reload_interval_s: float | None = 1.0,
        watch_in_thread: bool = False,
        latency_window: int = 4096,
        bandit: BanditPolicy | None = None,
    ):
        """``rules_path=None`` uses the packaged default rules (not watched).

        The canary split (``hybrid.speculative_fraction``) is not the
        dispatcher's: it is the engine's (one ``Canary`` per engine, applied at
        admission).

        ``reload_interval_s=None`` turns watching off; ``0`` polls on every
        decision (tests).  Raises ``RuleFileError`` when the initial rules do
        not compile, ``ConfigError`` for bad settings.
        """
        if reload_interval_s is not None and reload_interval_s < 0:
            raise ConfigError("hybrid.reload_interval_s", f"must be >= 0 or None, got {reload_interval_s}")
        self._loaded = _check_methods(loaded_methods)
        self.bandit = bandit
        self._last: tuple[str, str] | None = None  # (class, arm) of the last step the bandit chose
        self.fallback = LoadFallback(load_threshold, load_resume_threshold, load_signal,
                                     max_batch_size, queue_capacity)
        self._latency = LatencyRing(latency_window)
        self._decisions = {method: 0 for method in (*self._loaded, NONE)}
        self._fallback_steps = 0
        self._reload_lock = threading.Lock()
        self._reload_failures = 0
        self._last_reload_error: RuleFileError | None = None
        self._version = 1

        self._watched = rules_path is not None
        self.rules_path = Path(rules_path) if rules_path is not None else default_rules_path()
        self._stamp: FileStamp | None = file_stamp(self.rules_path)
        self._rules: tuple[Rule, ...] = ()
        self._active: tuple[tuple[Predicate | None, str], ...] = ()
        # a bandit without a rule file decides every step (the built-in rules would pin methods it should weigh)
        self._install(load_rules(self.rules_path) if self._watched or bandit is None else ())

        self._interval_ns = 0 if reload_interval_s is None else int(reload_interval_s * 1e9)
        self._next_poll_ns = _NEVER
        self._thread: PollingThread | None = None
        if self._watched and reload_interval_s is not None:
            if watch_in_thread:
                self._thread = PollingThread(self.reload_if_changed, max(reload_interval_s, 0.001))
                self._thread.start()
            else:
                self._next_poll_ns = perf_counter_ns() + self._interval_ns

    # -- the hot path --------------------------------------------------
    def choose(self, signals: StepSignals) -> str:
        """The method for the next step: a loaded method's name or "none"."""
        start = perf_counter_ns()
        if start >= self._next_poll_ns:
            self._next_poll_ns = start + self._interval_ns
            self.reload_if_changed()
        self._last = None
        if self.fallback.update(signals):
            method = NONE
            self._fallback_steps += 1
        else:
            method = BANDIT if self.bandit is not None else NONE  # what no rule matching means
            for predicate, candidate in self._active:
                if predicate is None or predicate(signals):
                    method = candidate
                    break
            if method == BANDIT:
                klass = step_class(signals.context_length, signals.batch_size, signals.match_length)
                method = self.bandit.choose(klass, signals.batch_size)
                self._last = (klass, method)
        self._decisions[method] += 1
        self._latency.record(perf_counter_ns() - start)
        return method

    def vetoed(self) -> None:
        """A later gate made the bandit's choice for this step a plain step: the bandit hears of it
        (``BanditPolicy.vetoed``) and the step is observed as the plain arm's, which is what ran."""
        if self.bandit is None or self._last is None or self._last[1] == NONE:
            return
        klass, arm = self._last
        self.bandit.vetoed(klass, arm)
        self._last = (klass, NONE) if NONE in self.bandit.arms else None

    def observe_step(self, tokens: int, seconds: float) -> None:
        """The last chosen step committed ``tokens`` in ``seconds`` (decode steps only): the bandit learns."""
        if self.bandit is not None and self._last is not None:
            self.bandit.observe(self._last[0], self._last[1], tokens, seconds)
        self._last = None

    # -- rules -----------------------------------------------------------
    @property
    def rules(self) -> tuple[Rule, ...]:
        """All rules of the file in force, loaded methods or not."""
        return self._rules

    @property
    def loaded_methods(self) -> tuple[str, ...]:
        return self._loaded

    @property
    def last_reload_error(self) -> RuleFileError | None:
        return self._last_reload_error

    @property
    def load_fallback_active(self) -> bool:
        return self.fallback.active

    def set_loaded_methods(self, methods: Iterable[str]) -> None:
        """Change which methods may be chosen (a drafter came up or went away)."""
        self._loaded = _check_methods(methods)
        for method in self._loaded:
            self._decisions.setdefault(method, 0)
        self._install(self._rules)

    def reload_if_changed(self) -> bool:
        """Re-read the rule file if its stamp changed; True when new rules were installed."""
        if not self._watched or file_stamp(self.rules_path) == self._stamp:
            return False
        return self.reload()

    def reload(self) -> bool:
        """Re-read the rule file now; on error keep the old rules and return False."""
        with self._reload_lock:
            # Stamp before reading: a write that lands during the read changes the
            # stamp again, so the next poll reads the file once more.
            self._stamp = file_stamp(self.rules_path)
            try:
                self._install(load_rules(self.rules_path))
            except RuleFileError as exc:
                self._reload_failures += 1
                self._last_reload_error = exc
                log.warning("rule file not reloaded, keeping the previous %d rules: %s", len(self._rules), exc)
                return False
            rules = self._rules
            self._version += 1
            self._last_reload_error = None
            log.info("reloaded %d rules from %s (version %d)", len(rules), self.rules_path, self._version)
            return True

    def _install(self, rules: tuple[Rule, ...]) -> None:
        if self.bandit is None:
            for rule in rules:
                if rule.method == BANDIT:
                    raise RuleFileError(str(self.rules_path), 'this rule hands its steps to the bandit policy, '
                                        'but hybrid.policy is not "bandit": configure it or pin a method',
                                        rule.line, rule.column)
        loaded = set(self._loaded)
        active = tuple((rule.predicate, rule.method) for rule in rules
                       if rule.method in (NONE, BANDIT) or rule.method in loaded)
        if not active and self.bandit is None:
            log.info("no rule in %s names a loaded method (%s): every step decodes plainly",
                     self.rules_path, ", ".join(self._loaded) or "none loaded")
        # measuring match_length costs a suffix lookup per sequence and step: only when something reads it
        # (a name inside a condition that compiled can only be that signal)
        self.needs_match_length = self.bandit is not None or any(
            rule.when is not None and "match_length" in rule.when for rule in rules)
        # likewise every method's acceptance and the remote drafters' health: only rules read them
        self.needs_accept_rate = any(rule.when is not None and "accept_rate" in rule.when for rule in rules)
        self.needs_remote_health = any(rule.when is not None and "remote_health" in rule.when for rule in rules)
        self._rules = rules
        self._active = active  # one assignment: choose() sees the old or the new set, never a mix

    # -- observation -----------------------------------------------------
    def snapshot(self) -> DispatchSnapshot:
        p50, p99 = self._latency.percentiles(50, 99)
        error = self._last_reload_error
        return DispatchSnapshot(
            decisions=dict(self._decisions),
            load_fallback_active=self.fallback.active,
            load=self.fallback.last_load,
            load_fallback_steps=self._fallback_steps,
            load_fallback_engagements=self.fallback.engagements,
            rules_version=self._version,
            reload_failures=self._reload_failures,
            last_reload_error=None if error is None else str(error),
            latency_p50_ns=p50,
            latency_p99_ns=p99,
            latency_samples=len(self._latency),
            bandit=None if self.bandit is None else self.bandit.snapshot(),
        )

    def close(self) -> None:
        """Stop the watcher thread, if any."""
        if self._thread is not None:
            self._thread.stop()
            self._thread = None

    def __enter__(self) -> "HybridDispatcher":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _check_methods(methods: Iterable[str]) -> tuple[str, ...]:
    if isinstance(methods, str):  # "eagle" would otherwise read as five one-letter methods
        methods = (methods,)
    checked: list[str] = []
    for method in methods:
        if method not in METHODS:
            raise ConfigError("hybrid.methods", f"unknown method {method!r}; methods are {', '.join(METHODS)}")
        if method not in checked:
            checked.append(method)
    return tuple(checked)
