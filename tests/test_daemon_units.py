"""Pure pieces of the daemon: stop strings and UTF-8, settings validation, authentication, hashes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from pydantic import ValidationError

from sinkd.cachepolicy import PolicyConfig
from sinkd.daemon.callers.auth import Authenticator
from sinkd.daemon.config import Settings
from sinkd.daemon.runtime.loop.textout import TextAssembler
from sinkd.daemon.runtime.sessions import ModelIdentity, generation_hash
from sinkd.errors import InvalidInput, Unauthenticated

pytestmark = pytest.mark.unit


def feed_all(stops: list[str], pieces: list[bytes]) -> tuple[str, str | None]:
    a = TextAssembler(stops)
    out = "".join(a.feed(p) for p in pieces)
    return out + a.flush(), a.stopped


def test_stop_string_across_tokens_is_never_shown() -> None:
    out, stopped = feed_all(["\nUser:"], [b"Hello", b" there", b"\nUs", b"er:", b" more"])
    assert out == "Hello there" and stopped == "\nUser:"


def test_partial_stop_is_held_then_released() -> None:
    a = TextAssembler(["END"])
    assert a.feed(b"the EN") == "the "
    assert a.feed(b"D") == "" and a.stopped == "END"
    b = TextAssembler(["END"])
    assert b.feed(b"the EN") == "the "
    assert b.feed(b"ergy") == "ENergy"


def test_multibyte_characters_wait_until_whole() -> None:
    euro = "€".encode()
    a = TextAssembler([])
    assert a.feed(euro[:1]) == ""
    assert a.feed(euro[1:]) == "€"
    assert feed_all([], [b"\xff", b"ok"])[0] == "\ufffdok"  # invalid bytes are replaced


def test_stop_that_never_matches_changes_nothing() -> None:
    assert feed_all(["<never>"], [b"a", b"<nev", b"b"]) == ("a<nevb", None)


def test_settings_name_each_invalid_field(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as err:
        Settings(socket=tmp_path / "s", n_ctx_seq=0, max_sessions=1000)
    fields = {e["loc"][0] for e in err.value.errors()}
    assert fields == {"n_ctx_seq", "max_sessions"}
    with pytest.raises(ValidationError, match="needs tenants"):
        Settings(socket=tmp_path / "s", tcp="127.0.0.1:0")
    with pytest.raises(ValidationError, match="not loopback"):
        Settings(
            socket=tmp_path / "s",
            tcp="0.0.0.0:9000",
            tenants=[{"name": "a", "token_sha256": "0" * 64}],
        )
    with pytest.raises(ValidationError, match="step_tokens"):
        Settings(socket=tmp_path / "s", step_tokens=512, n_batch=256)


def test_settings_from_toml_and_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    toml = tmp_path / "sinkd.toml"
    toml.write_text(
        'max_sessions = 3\nn_ctx_seq = 1024\n[[tenants]]\nname = "t1"\ntoken_sha256 = "'
        + "a" * 64
        + '"\n'
    )
    monkeypatch.setenv("SINKD_CONFIG", str(toml))
    monkeypatch.setenv("SINKD_N_CTX_SEQ", "512")
    s = Settings(socket=tmp_path / "s")
    assert s.max_sessions == 3 and s.n_ctx_seq == 512 and s.tenants[0].name == "t1"


def test_a_missing_config_file_is_an_error_not_the_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SINKD_CONFIG", str(tmp_path / "sinkd.tmol"))  # a typo
    with pytest.raises(InvalidInput, match="does not exist"):
        Settings(socket=tmp_path / "s")


def test_one_token_cannot_name_two_principals(tmp_path: Path) -> None:
    same = hashlib.sha256(b"tok").hexdigest()
    with pytest.raises(ValidationError, match="share a token"):
        Settings(
            socket=tmp_path / "s",
            tenants=[{"name": "a", "token_sha256": same}, {"name": "b", "token_sha256": same}],
        )
    with pytest.raises(ValidationError, match="also a tenant's token"):
        Settings(
            socket=tmp_path / "s",
            tenants=[{"name": "a", "token_sha256": same}],
            admin_token_sha256=same,
        )


def test_authentication(tmp_path: Path) -> None:
    s = Settings(
        socket=tmp_path / "s",
        tenants=[{"name": "alice", "token_sha256": hashlib.sha256(b"tok").hexdigest()}],
        admin_token_sha256=hashlib.sha256(b"adm").hexdigest(),
    )
    auth = Authenticator(s)
    assert auth.authenticate([("authorization", "Bearer tok")]).tenant == "alice"
    admin = auth.authenticate([("authorization", "bearer adm")])
    assert admin.admin and admin.tenant is None
    for md in ([], [("authorization", "Bearer x")], [("authorization", "tok")]):
        with pytest.raises(Unauthenticated):
            auth.authenticate(md)
    local = Authenticator(Settings(socket=tmp_path / "s")).authenticate([])
    assert local.tenant == "local"


def test_generation_hash_changes_with_every_input() -> None:
    model = ModelIdentity("m", "a" * 64, "t" * 64, "c" * 64)
    policy = PolicyConfig.named("sink", sinks=4, window=60)
    base = dict(
        session_id="s",
        tenant="t",
        reset_count=0,
        model=model,
        system_prompt_sha256="p",
        policy=policy,
    )
    h0 = generation_hash(**base)  # type: ignore[arg-type]
    variants = [
        {"session_id": "s2"},
        {"tenant": "u"},
        {"reset_count": 1},
        {"model": ModelIdentity("m", "b" * 64, "t" * 64, "c" * 64)},
        {"model": ModelIdentity("m", "a" * 64, "u" * 64, "c" * 64)},
        {"model": ModelIdentity("m", "a" * 64, "t" * 64, "d" * 64)},
        {"system_prompt_sha256": "q"},
        {"policy": PolicyConfig.named("sink", sinks=4, window=60, evict_chunk=2)},
    ]
    hashes = {generation_hash(**{**base, **v}) for v in variants}  # type: ignore[arg-type]
    assert h0 not in hashes and len(hashes) == len(variants)
