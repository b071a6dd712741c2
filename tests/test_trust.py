"""What an operator on a shared machine relies on: directories only their owner can change, a
client that checks whose socket it talks to, TLS end to end, no token sent in clear."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sinkd.cli.main import app
from sinkd.daemon.node import Daemon
from sinkd.daemon.private import check_private_dir, check_socket_owner, private_dir
from sinkd.daemon.rpc.client import Client, TlsFiles
from sinkd.daemon.store.journal import Journal
from sinkd.errors import DaemonUnavailable, InvalidInput, JournalError, UntrustedPath
from tests.support.certs import self_signed
from tests.support.settings import settings

OTHER_UID = os.getuid() + 1  # a uid that is not ours, for the checks that take one


# --- directories ---


@pytest.mark.unit
def test_a_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    planted = tmp_path / "sinkd"
    planted.mkdir()
    os.chmod(planted, 0o777)
    with pytest.raises(UntrustedPath, match="writable by others"):
        private_dir(planted)
    child = planted / "inner"  # and nothing below it is trusted either
    with pytest.raises(UntrustedPath, match="writable by others"):
        private_dir(child)
    assert not child.exists()


@pytest.mark.unit
def test_another_users_directory_or_ancestor_is_refused(tmp_path: Path) -> None:
    d = private_dir(tmp_path / "run" / "sinkd")
    with pytest.raises(UntrustedPath, match="belongs to uid"):
        check_private_dir(d, uid=OTHER_UID)
    if os.getuid() == 0:  # root can make the real case: /tmp/sinkd-$UID made first by another user
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o755)
        os.chown(theirs, 65534, 65534)
        with pytest.raises(UntrustedPath, match="belongs to uid 65534"):
            private_dir(theirs / "sinkd")


@pytest.mark.unit
def test_a_symlinked_directory_is_refused_and_a_readable_one_tightened(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(UntrustedPath, match="symlink"):
        private_dir(tmp_path / "link")
    readable = tmp_path / "readable"
    readable.mkdir()
    os.chmod(readable, 0o755)
    private_dir(readable)
    assert stat.S_IMODE(readable.stat().st_mode) == 0o700
    made = private_dir(tmp_path / "a" / "b")
    assert stat.S_IMODE(made.stat().st_mode) == stat.S_IMODE(made.parent.stat().st_mode) == 0o700


@pytest.mark.unit
def test_a_daemon_refuses_a_planted_runtime_directory_and_binds_nothing(tmp_path: Path) -> None:
    planted = tmp_path / "sinkd-run"
    planted.mkdir()
    os.chmod(planted, 0o777)
    d = Daemon(settings(tmp_path, durable=False, socket=planted / "sinkd.sock"))
    with pytest.raises(UntrustedPath):
        d.start()
    assert list(planted.iterdir()) == []


@pytest.mark.unit
def test_the_state_directory_is_locked_before_anything_listens(tmp_path: Path) -> None:
    first = Daemon(settings(tmp_path / "a", state_dir=tmp_path / "state"))
    first.service.claim()
    try:
        second = Daemon(settings(tmp_path / "b", state_dir=tmp_path / "state"))
        with pytest.raises(JournalError, match="in use by another sinkd"):
            second.start()
        assert not second.settings.socket.exists()  # refused before it bound its socket
    finally:
        first.service.unclaim()
    link = tmp_path / "state-link"
    link.symlink_to(tmp_path / "state")
    with pytest.raises(UntrustedPath, match="symlink"):
        Daemon(settings(tmp_path / "c", state_dir=link)).start()


@pytest.mark.unit
def test_the_journal_is_the_owners_alone_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        journal = Journal(tmp_path / "journal.db")
        journal.put_session("s", "alice", {})
        journal.commit()
    finally:
        os.umask(old)
    names = ["journal.db", "journal.db-wal", "journal.db-shm"]
    modes = {n: stat.S_IMODE((tmp_path / n).stat().st_mode) for n in names}
    journal.close()
    assert modes == dict.fromkeys(names, 0o600)


# --- the client's side ---


@pytest.mark.unit
def test_a_client_refuses_a_socket_that_is_not_its_users(tmp_path: Path) -> None:
    path = tmp_path / "sinkd.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    try:
        check_socket_owner(path)  # ours: fine
        if os.getuid() == 0:  # root can make the real case: a socket another user planted
            os.chown(path, 65534, 65534)
            with pytest.raises(UntrustedPath, match="belongs to uid 65534"):
                check_socket_owner(path)
            with pytest.raises(UntrustedPath, match="not this user's daemon"):
                Client(f"unix:{path}", token="t")
        else:  # as seen by another user
            with pytest.raises(UntrustedPath, match="not this user's daemon"):
                check_socket_owner(path, uid=OTHER_UID)
        (tmp_path / "file").write_text("")
        with pytest.raises(UntrustedPath, match="not a socket"):
            Client(f"unix:{tmp_path / 'file'}", token="t")
    finally:
        s.close()


@pytest.mark.unit
def test_no_bearer_token_goes_in_clear_beyond_loopback() -> None:
    with pytest.raises(InvalidInput, match="in clear"):
        Client("10.1.2.3:50051", token="secret")
    with pytest.raises(InvalidInput, match="in clear"):
        Client("dns:sinkd.example:50051", token="secret")
    Client("127.0.0.1:50051", token="secret").channel.close()  # loopback: no one else on the wire
    Client("10.1.2.3:50051").channel.close()  # no token to leak (health checks)


# --- TLS end to end ---


@pytest.fixture(scope="module")
def mtls_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Path]]:
    tmp = tmp_path_factory.mktemp("mtls")
    cert, key = self_signed(tmp / "server")
    client_cert, _ = self_signed(tmp / "client", "client")
    d = Daemon(
        settings(
            tmp, durable=False, tcp="localhost:0", tls_cert=cert, tls_key=key,
            tls_client_ca=client_cert,
        )
    )  # fmt: skip
    d.start()
    d.wait_ready(120)
    yield d, tmp
    d.stop()


@pytest.mark.model
def test_tls_with_client_certificates_from_the_python_client(
    mtls_daemon: tuple[Daemon, Path],
) -> None:
    d, tmp = mtls_daemon
    port = d.addresses[1].rsplit(":", 1)[1]
    address = f"localhost:{port}"
    ca = tmp / "server" / "server.pem"
    cert, key = tmp / "client" / "client.pem", tmp / "client" / "client-key.pem"
    with_cert = Client(address, token="bob-token", tls=TlsFiles(ca, cert, key), wait_s=10)
    assert with_cert.list() == []
    with pytest.raises(DaemonUnavailable):  # no certificate: the handshake fails, no call made
        Client(address, token="bob-token", tls=TlsFiles(ca), wait_s=3)
    with pytest.raises(InvalidInput, match="go together"):
        Client(address, token="bob-token", tls=TlsFiles(ca, cert, None))


@pytest.mark.model
def test_tls_from_the_command_line(mtls_daemon: tuple[Daemon, Path]) -> None:
    d, tmp = mtls_daemon
    port = d.addresses[1].rsplit(":", 1)[1]
    args = [
        "--tls-ca", str(tmp / "server" / "server.pem"),
        "--client-cert", str(tmp / "client" / "client.pem"),
        "--client-key", str(tmp / "client" / "client-key.pem"),
        "sessions", "list", "--connect", f"localhost:{port}", "--token", "bob-token", "--json",
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "[]"
    result = CliRunner().invoke(app, args[6:])  # no CA: the handshake cannot succeed
    assert result.exit_code == 10, result.output
