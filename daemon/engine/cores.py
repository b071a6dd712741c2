"""The CPU cores, shared between the processes that run sinkd's engine on this machine.

llama.cpp's CPU threads spin at every barrier while they wait for each other. Two processes that
each use every core keep taking the core the other's threads are waiting for, and each runs at a
quarter of its alone speed; with the cores split between them each keeps ~0.95 of what its share
gives (bench/two_processes.py). So an engine whose thread count was not given registers here while
it decodes and runs with its cores divided by the engines registered, re-read every second:
llama.cpp takes a new thread count between two decodes, and its results do not depend on it
(tests/test_cores.py).

A registration is a file in a per-user folder, held under an exclusive flock: a process that dies
drops its lock with it, and the next reader removes the file. Engines of other users are not seen.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import time
from pathlib import Path

from sinkd.daemon.config import default_socket
from sinkd.daemon.private import private_dir
from sinkd.errors import UntrustedPath

log = logging.getLogger("sinkd.cores")
REFRESH_S = 1.0


def default_folder() -> Path:
    """Beside the daemon's default socket: per user, in the runtime directory."""
    return default_socket().parent / "engines"


class CoreShare:
    """This engine's registration while it decodes, and its share of `cores` threads.

    An engine counts while it is busy: `threads` (before each decode) registers it, `idle` (when
    it has had nothing to decode for `refresh_s`) takes it back, so an idle daemon or chat leaves
    every core to the one that works."""

    def __init__(
        self, cores: int, folder: Path | None = None, refresh_s: float | None = None
    ) -> None:
        self.cores = max(1, cores)
        self.folder = folder or default_folder()
        self.refresh_s = REFRESH_S if refresh_s is None else refresh_s
        self._fd: int | None = None
        self._path: Path | None = None
        self._share = self.cores
        self._read_at = 0.0
        self._busy_at = 0.0
        self._broken = False  # registering failed once: this engine uses every core

    @property
    def registered(self) -> bool:
        return self._fd is not None

    def threads(self) -> int:
        """Before a decode: this engine's thread count (registers it; re-reads the others at most
        every `refresh_s`)."""
        now = time.monotonic()
        self._busy_at = now
        if not self.registered and not self._broken:
            try:
                self._register()
            except (OSError, UntrustedPath) as e:
                self._broken = True
                log.warning("cannot register in %s (%s): the cores are not shared", self.folder, e)
                return self._share
            return self.refresh()
        if self.registered and now - self._read_at >= self.refresh_s:
            return self.refresh()
        return self._share

    def idle(self) -> None:
        """Nothing to decode: after `refresh_s` of it, this engine stops counting."""
        if self.registered and time.monotonic() - self._busy_at >= self.refresh_s:
            self.close()
            self._share = self.cores

    def refresh(self) -> int:
        """Read the registrations now; this engine's thread count."""
        self._read_at = time.monotonic()
        if self.registered:
            self._share = max(1, self.cores // self.engines())
        return self._share

    def engines(self) -> int:
        """Engines registered now (this one included); removes what dead processes left."""
        live = 0
        try:
            names = os.listdir(self.folder)
        except OSError:
            return 1
        for name in names:
            if name.startswith("."):
                continue
            path = self.folder / name
            try:
                fd = os.open(path, os.O_RDWR)
            except OSError:
                continue  # removed meanwhile
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                live += 1  # held: a running engine (this process's own too)
            except OSError:
                pass
            else:  # nobody holds it: its process is gone
                with contextlib.suppress(OSError):
                    path.unlink()
            finally:
                os.close(fd)
        return max(live, 1)

    def _register(self) -> None:
        private_dir(self.folder)  # another user's folder could feed this engine its share
        name = f"{os.getpid()}-{secrets.token_hex(4)}"
        hidden = self.folder / f".{name}"  # locked before it is visible: never taken for stale
        fd = os.open(hidden, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(hidden, self.folder / name)
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                hidden.unlink()
            raise
        self._fd, self._path = fd, self.folder / name

    def close(self) -> None:
        """Stop counting (at idle, and when the engine closes)."""
        if self._fd is None:
            return
        if self._path is not None:
            with contextlib.suppress(OSError):
                self._path.unlink()
        os.close(self._fd)
        self._fd = self._path = None
