"""What the tests share: tokens, settings, clients, daemons, texts, the CLI runner and the fakes.
Tests import from here, never from each other."""
