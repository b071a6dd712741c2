"""Facts about a log stream, computed from its lines, and the check that holds a model's narration
of them to those lines. Pure: no engine, no service, no transport."""
