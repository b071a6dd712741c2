"""What the HTTP front's clients keep on the daemon: where a stateless client's conversations stand
(`StatelessChats`, hashes only) and a stateful client's stored responses (`Responses`), each
journalled on the engine thread beside the sessions they belong to, and read back at resume."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import logging
import secrets
from collections.abc import Callable
from pathlib import Path

from sinkd.daemon.engine.llama import Engine
from sinkd.daemon.private import secret
from sinkd.daemon.runtime.access import Access
from sinkd.daemon.runtime.api import PolicyRequest
from sinkd.daemon.runtime.conversations.chains import ConversationIndex, Place
from sinkd.daemon.runtime.conversations.chats import Close, Create, Rewind, StatelessChats
from sinkd.daemon.runtime.conversations.responses import Responses, StoredResponse
from sinkd.daemon.runtime.durable.durability import Durability
from sinkd.daemon.runtime.erasure import Erasure
from sinkd.daemon.runtime.loop.scheduler import Scheduler
from sinkd.daemon.runtime.turns import Turns
from sinkd.daemon.store.journal import ClientTables
from sinkd.errors import SinkdError, UntrustedPath

log = logging.getLogger("sinkd.clients")


def conversations_key(path: Path) -> bytes:
    """The hash chains' key: made once in the state directory, or a file the nodes of a
    deployment share (its owner's alone: with it, a hash would confirm a guessed history)."""
    if path.exists() and path.stat().st_mode & 0o077:
        raise UntrustedPath(f"{path}: the conversations key must be its owner's alone (chmod 600)")
    return secret(path)


def key_fingerprint(key: bytes) -> str:
    return hmac.new(key, b"sinkd conversations key fingerprint", hashlib.sha256).hexdigest()[:16]


def http_policy(window: int | None) -> PolicyRequest:
    """The policy of the sessions the HTTP front makes: the sink policy with the window
    `http_window` names, else one that fills the session's cells (a chat UI's side prompts, a title
    or tags request of a few hundred tokens, must keep their instructions: the model's default
    window, 252 in a 1,024-cell allocation, evicted them before the answer)."""
    if window is not None:
        return PolicyRequest(name="sink", window=window)
    return PolicyRequest(name="sink", fill_window=True)


class ClientState:
    def __init__(
        self,
        access: Access,
        turns: Turns,
        scheduler: Scheduler,
        durability: Durability | None,
        create: Create,
        close: Close,
        rewind: Rewind,
        window: int | None = None,
        key_file: Path | None = None,
        pin_bound: int = 0,
        ui_task_grammar: bool = True,
        erasure: Erasure | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.durability = durability
        self.erasure = erasure
        self.key_file = key_file
        self.conversations = ConversationIndex(secrets.token_bytes(32))
        durable = durability is not None
        self.stateless = StatelessChats(
            access, turns, self.conversations, create, close, rewind,
            self._put_head if durable else None, http_policy(window), pin_bound, ui_task_grammar,
        )  # fmt: skip
        self.responses = Responses(
            access, turns, lambda p, system: self.stateless.new_session(p, system, stateless=False),
            close, rewind, self._put_response if durable else None,
            self._drop_response if durable else None, pin_bound,
        )  # fmt: skip

    def load(self) -> None:
        """At resume (engine thread): the hash chain's key, kept with the state so that where
        conversations stand outlives restarts, then every journalled place and response."""
        d = self.durability
        assert d is not None
        self.conversations.key = conversations_key(self.key_file or d.dir / "conversations.key")
        self.adopt()

    def adopt(self, session_id: str | None = None) -> None:
        """Where the journal says conversations stand, and their stored responses: every
        session's at resume, one session's once it was imported (engine thread)."""
        assert self.durability is not None
        tables = self.durability.client_tables()
        for sid, reset_count, tenant, head, before, n_before in tables.heads(session_id):
            self.conversations.place(sid, Place(tenant, reset_count, head, before, n_before))
            self.stateless.adopt(sid)
        for record in tables.responses(session_id):
            self.responses.adopt(StoredResponse.from_record(json.loads(record)))

    def key_fingerprint(self) -> str:
        """Names the hash chains' key without telling it: an archive's conversations continue
        on a node with the same fingerprint alone."""
        return key_fingerprint(self.conversations.key)

    def _put_head(self, session_id: str, place: Place) -> None:
        """Where a conversation stands (the reply is already given: a crash before this commit
        costs the next turn a re-read of its history, nothing else)."""
        head = place.head
        assert head is not None
        self._journal(
            session_id,
            lambda t: t.put_head(session_id, place.reset_count, place.tenant, head, place.before,
                                 place.n_before),
        )  # fmt: skip

    def _put_response(self, stored: StoredResponse) -> None:
        record = json.dumps(dataclasses.asdict(stored))
        self._journal(
            stored.session_id,
            lambda t: t.put_response(stored.id, stored.session_id, stored.reset_count, record),
        )

    def _drop_response(self, response_id: str) -> bool:
        """A delete the journal did not take is not done (raises); the write-ahead log's copy of
        the text goes with its purge, which the reply waits for (`Erasure`). Whether it is still
        owed."""
        durability, erasure = self.durability, self.erasure
        assert durability is not None and erasure is not None

        def drop(engine: Engine) -> None:
            durability.client_tables().drop_response(response_id)
            durability.owe_purge()
            durability.commit()

        return erasure.run(drop)[1]

    def _journal(self, what: str, write: Callable[[ClientTables], None]) -> None:
        durability = self.durability
        assert durability is not None

        def run(engine: Engine) -> None:
            write(durability.client_tables())
            durability.commit()

        try:
            self.scheduler.call(run)
        except SinkdError as e:
            log.warning("%s: not journalled: %s", what, type(e).__name__)
