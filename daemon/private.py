"""Directories only their owner can change: the runtime directory (socket, core registrations)
and the state directory (journal, snapshots).

Without `XDG_RUNTIME_DIR` the socket lives under a predictable `/tmp/sinkd-$UID/`; another user who
made that first could take the daemon's place or plant files in it. So, like OpenSSH's
StrictModes: every ancestor must belong to this user or root and be writable by nobody else (a
sticky, root-owned directory such as /tmp excepted), and the directory itself must be a real
directory (no symlink), this user's, with no access for group or others. A directory that is ours
but readable by others is tightened to 0700; anything else is refused with what to fix.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

from sinkd.errors import UntrustedPath

_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def _ancestors_trusted(path: Path, uid: int) -> None:
    for parent in reversed(path.parents):
        info = parent.lstat()
        if stat.S_ISLNK(info.st_mode):
            if info.st_uid not in (0, uid):
                raise UntrustedPath(f"{parent} is a symlink owned by uid {info.st_uid}")
            info = parent.stat()
        if info.st_uid not in (0, uid):
            raise UntrustedPath(f"{parent} belongs to uid {info.st_uid}, not to this user or root")
        sticky_system = info.st_uid == 0 and info.st_mode & stat.S_ISVTX
        if info.st_mode & _OTHERS_WRITE and not sticky_system:
            raise UntrustedPath(
                f"{parent} is writable by others (mode {stat.S_IMODE(info.st_mode):04o})"
            )


def check_private_dir(path: Path, uid: int | None = None) -> None:
    """Refuse (UntrustedPath) unless `path` is a directory only `uid` (default: ours) can use."""
    uid = os.getuid() if uid is None else uid
    path = path.absolute()
    _ancestors_trusted(path, uid)
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        raise UntrustedPath(f"{path} is a symlink; sinkd uses a real directory there")
    if not stat.S_ISDIR(info.st_mode):
        raise UntrustedPath(f"{path} is not a directory")
    if info.st_uid != uid:
        raise UntrustedPath(f"{path} belongs to uid {info.st_uid}, not to this user ({uid})")
    if info.st_mode & _OTHERS_WRITE:
        raise UntrustedPath(
            f"{path} is writable by others (mode {stat.S_IMODE(info.st_mode):04o}); what is in it"
            f" cannot be trusted: remove it, or check it and chmod 700"
        )


def private_dir(path: Path, uid: int | None = None) -> Path:
    """`path` made (each missing level 0700) or checked, and left mode 0700; UntrustedPath if
    someone else could change it."""
    uid = os.getuid() if uid is None else uid
    path = path.absolute()
    missing = [p for p in (path, *path.parents) if not os.path.lexists(p)]
    for level in reversed(missing):  # nothing is made inside a directory that is not trusted
        _ancestors_trusted(level, uid)
        with contextlib.suppress(FileExistsError):  # made meanwhile: checked below like any other
            level.mkdir(mode=0o700)
    check_private_dir(path, uid)
    if stat.S_IMODE(path.lstat().st_mode) != 0o700:
        os.chmod(path, 0o700)  # ours and writable by no one else: only its readers go
    return path


def secret(path: Path, size: int = 32) -> bytes:
    """A secret of this daemon's: made once (random, mode 0600, never replaced), read after."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        data = secrets.token_urlsafe(size).encode()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return data


def check_socket_owner(path: Path, uid: int | None = None) -> None:
    """A client's check before it sends a token: the socket is this user's (or root's), in a
    directory no one else can change."""
    uid = os.getuid() if uid is None else uid
    path = path.absolute()
    try:
        info = path.lstat()
    except FileNotFoundError:
        return  # nothing there: connecting fails with the usual "no daemon" answer
    if not stat.S_ISSOCK(info.st_mode):
        raise UntrustedPath(f"{path} is not a socket")
    if info.st_uid not in (0, uid):
        raise UntrustedPath(
            f"{path} belongs to uid {info.st_uid}: not this user's daemon; refusing to send it"
            " a token or text"
        )
    _ancestors_trusted(path, uid)
