"""Watching the rule file by polling its stamp (no inotify dependency).

A file counts as changed when its (mtime_ns, size, inode, device) stamp
differs from the one recorded when it was last read.  Editors that save by
rename change the inode; in-place writes change the size or mtime.  A
same-size in-place rewrite within the filesystem's timestamp granularity
(a few ms) can go unseen until the next change; ``HybridDispatcher.reload()``
forces a read.
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger("hyspec.policy")


@dataclass(frozen=True, slots=True)
class FileStamp:
    mtime_ns: int
    size: int
    inode: int
    device: int


def file_stamp(path: str | os.PathLike[str]) -> FileStamp | None:
    """The file's stamp, or None when it does not exist or cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return FileStamp(st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev)


class PollingThread:
    """Calls ``poll()`` every ``interval_s`` on a daemon thread until ``stop()``."""

    def __init__(self, poll: Callable[[], object], interval_s: float, name: str = "hyspec-rules-watch"):
        if interval_s <= 0:
            raise ValueError(f"poll interval must be > 0 seconds, got {interval_s}")
        self._poll = poll
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._poll()
            except Exception:  # a watcher that dies silently would freeze the rules: log and go on
                log.exception("rule file poll failed; will retry")
