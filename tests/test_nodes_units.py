"""The pieces of a deployment that need no model: where an id was made, what a node answers for
a session it does not hold, a conversation that comes back behind, and the files `sinkd nodes
init` writes (HAProxy itself checks its configuration)."""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from sinkd.cli import deployment as deploy
from sinkd.daemon.runtime.api import Turn
from sinkd.daemon.runtime.conversations.chains import ConversationIndex, Place, chain
from sinkd.daemon.runtime.sessions import Registry, new_session_id, origin_of
from sinkd.errors import InvalidInput, NotFound, SessionElsewhere

HAPROXY = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")

pytestmark = pytest.mark.unit


def test_an_id_names_the_node_that_made_it() -> None:
    assert origin_of(new_session_id("n2")) == "n2"
    assert origin_of(new_session_id("eu-west-3")) == "eu-west-3"
    assert origin_of(new_session_id()) is None
    assert origin_of("resp_n1-00ff") == "n1"
    assert origin_of("s_0123") is None and origin_of("s_-00") is None


def test_a_node_says_unavailable_only_for_sessions_that_live_elsewhere() -> None:
    r = Registry("n1")
    assert isinstance(r.missing("alice", new_session_id("n2")), SessionElsewhere)
    assert isinstance(r.missing("alice", new_session_id("n1")), NotFound)  # its own: gone
    assert isinstance(r.missing("alice", new_session_id()), NotFound)
    moved = new_session_id("n1")
    r.moved_out(moved, "alice")
    assert isinstance(r.missing("alice", moved), SessionElsewhere)
    assert isinstance(r.missing(None, moved), SessionElsewhere)  # the admin
    assert isinstance(r.missing("bob", moved), NotFound)  # nothing tells bob it existed
    r.moved_out(moved, None)  # it came back
    assert isinstance(r.missing("alice", moved), NotFound)
    alone = Registry()  # a single daemon: every unknown id is NOT_FOUND
    assert isinstance(alone.missing("alice", new_session_id("n2")), NotFound)


def test_a_conversation_that_went_on_elsewhere_finds_the_session_it_left() -> None:
    index = ConversationIndex(b"k")
    turns = [Turn("user", "a"), Turn("assistant", "b"), Turn("user", "c"), Turn("assistant", "d")]
    heads = chain(b"k", "sys", turns)
    index.place("s1", Place("alice", 0, heads[2]))  # it took the first two turns
    assert index.find_behind("alice", heads) == ("s1", 0, 2)
    assert index.find_behind("bob", heads) is None  # a tenant's histories match its own alone
    index.place("s2", Place("alice", 0, heads[4]))
    assert index.find_behind("alice", heads[:4]) == ("s1", 0, 2)  # the longest before the end
    assert index.find_behind("alice", heads[:1]) is None


def base_config(tmp_path: Path, tenants: bool = True) -> Path:
    path = tmp_path / "base.toml"
    body = 'admin_token_sha256 = "' + "a" * 64 + '"\n'
    if tenants:
        body += '[[tenants]]\nname = "alice"\ntoken_sha256 = "' + "b" * 64 + '"\n'
    path.write_text(body)
    return path


@pytest.mark.skipif(HAPROXY is None, reason="haproxy is not installed")
@pytest.mark.parametrize("n", [1, 3, 8])
def test_the_written_haproxy_configuration_is_valid_for_n_nodes(tmp_path: Path, n: int) -> None:
    d = deploy.plan(n, tmp_path / "out", base_config(tmp_path), first_port=30000)
    files = deploy.write(d, tmp_path / "out", base_config(tmp_path))
    check = subprocess.run(
        [HAPROXY, "-c", "-f", str(tmp_path / "out" / "haproxy.cfg")], capture_output=True
    )
    assert check.returncode == 0, check.stderr.decode()
    cfg = (tmp_path / "out" / "haproxy.cfg").read_text()
    assert cfg.count("hash-type consistent") == 2 and cfg.count(" track sinkd_http/") == n
    assert "option http-no-delay" in cfg  # streamed tokens are not held back in bursts
    assert stat.S_IMODE(d.conversations_key_file.stat().st_mode) == 0o600
    assert deploy.load(tmp_path / "out" / "deployment.toml") == d
    env = (tmp_path / "out" / "nodes" / "n1.env").read_text()
    assert (
        "SINKD_NODE=n1\n" in env
        and f"SINKD_CONVERSATIONS_KEY_FILE={d.conversations_key_file}" in env
    )
    key = d.conversations_key_file.read_bytes()
    deploy.write(d, tmp_path / "out", base_config(tmp_path))  # again: the key is kept
    assert d.conversations_key_file.read_bytes() == key and len(files) == n + 5
    assert d.route_keys() == {"alice": "b" * 64}  # read from the copy beside the files


def test_a_deployment_needs_tenants_and_the_admin(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="needs tenants"):
        deploy.plan(3, tmp_path, base_config(tmp_path, tenants=False))
    with pytest.raises(InvalidInput, match="between 1 and 64"):
        deploy.plan(0, tmp_path, base_config(tmp_path))
    (tmp_path / "bad.toml").write_text("[proxy]\n")
    with pytest.raises(InvalidInput, match="not a sinkd deployment"):
        deploy.load(tmp_path / "bad.toml")


@pytest.mark.skipif(HAPROXY is None, reason="haproxy is not installed")
def test_the_proxy_takes_tls_where_it_faces_a_network(tmp_path: Path) -> None:
    """`--tls-cert`: both frontends bind with TLS (ALPN h2 for gRPC); HAProxy accepts the file."""
    from tests.support.certs import self_signed

    cert, key = self_signed(tmp_path / "certs")
    pem = tmp_path / "proxy.pem"  # HAProxy wants the certificate and its key in one file
    pem.write_text(cert.read_text() + key.read_text())
    d = deploy.plan(2, tmp_path / "out", base_config(tmp_path), tls_cert=pem)
    deploy.write(d, tmp_path / "out", base_config(tmp_path))
    cfg = (tmp_path / "out" / "haproxy.cfg").read_text()
    assert cfg.count(f"ssl crt {pem} alpn h2,http/1.1") == 2
    check = subprocess.run(
        [HAPROXY, "-c", "-f", str(tmp_path / "out" / "haproxy.cfg")], capture_output=True
    )
    assert check.returncode == 0, check.stderr.decode()


def test_the_shipped_deployment_is_what_init_writes(tmp_path: Path) -> None:
    """deploy/haproxy/ is `sinkd nodes init` for three nodes installed in /etc/sinkd: written
    again, every file is the same (the shipped one cannot drift from the generator)."""
    shipped = Path(__file__).resolve().parent.parent / "deploy" / "haproxy"
    d = deploy.plan(3, tmp_path, shipped / "base.toml", install_dir=Path("/etc/sinkd"),
                    state_root=Path("/var/lib/sinkd"), run_dir=Path("/run/sinkd"))  # fmt: skip
    for path in deploy.write(d, tmp_path, shipped / "base.toml"):
        if path.name != "conversations.key":  # a secret: made at init, never shipped
            assert path.read_text() == (shipped / path.relative_to(tmp_path)).read_text(), path
