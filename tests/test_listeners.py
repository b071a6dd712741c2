"""A daemon never takes another's listener, and one that cannot listen leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from sinkd.daemon.node import Daemon
from sinkd.daemon.rpc.client import daemon_answers
from sinkd.errors import ListenError
from tests.support.settings import settings


@pytest.mark.model
def test_a_second_daemon_on_a_live_socket_refuses_and_leaves_the_first_serving(
    tmp_path: Path,
) -> None:
    first = Daemon(settings(tmp_path / "a", durable=False))
    first.start()
    try:
        first.wait_ready(120)
        sock = first.settings.socket
        inode = sock.lstat().st_ino
        second = Daemon(settings(tmp_path / "b", durable=False, socket=sock))
        with pytest.raises(ListenError, match="already listens"):
            second.start()
        assert sock.lstat().st_ino == inode  # the first daemon's socket, untouched
        assert daemon_answers(f"unix:{sock}")
    finally:
        first.stop()
    assert not sock.exists()  # its own socket goes with it


@pytest.mark.unit
def test_a_failed_tcp_bind_leaves_no_socket_behind(tmp_path: Path) -> None:
    import socket

    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # no SO_REUSEPORT: nobody shares it
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        d = Daemon(settings(tmp_path, durable=False, tcp=f"127.0.0.1:{taken.getsockname()[1]}"))
        with pytest.raises(ListenError):
            d.start()
        assert not d.settings.socket.exists()
    finally:
        taken.close()


@pytest.mark.unit
def test_a_stale_socket_of_a_killed_daemon_is_replaced(tmp_path: Path) -> None:
    import socket

    sock = tmp_path / "sinkd.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock))  # bound, never listening: what a kill -9 leaves
    stale.close()
    d = Daemon(settings(tmp_path, durable=False, socket=sock, tcp=None))
    try:
        assert d.grpc._bind_unix(sock) == f"unix:{sock}"
        assert sock.lstat().st_ino == d.grpc._socket_inode
    finally:
        d.grpc.stop(0)
        d.grpc.remove_own_socket()
