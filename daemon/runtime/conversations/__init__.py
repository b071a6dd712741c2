"""The conversation layer for the HTTP front's clients: a stateless client's history matched to the
session that took it (`chats`, over the hash chains of `chains`), a stateful client's stored
responses (`responses`), and what both keep on the daemon, journalled (`clients`)."""
