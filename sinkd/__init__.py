"""sinkd: a daemon that streams a small local LLM at constant memory with attention sinks.

Every part imports under this one name, so that nothing shadows other distributions' packages
(``daemon`` is python-daemon's import name, ``proto`` proto-plus's). The repository keeps the
folders of the design; ``pyproject.toml`` maps them here::

    sinkd.cachepolicy    the pure policy (no llama_cpp, no grpc)
    sinkd.daemon         engine/ (the one llama.cpp adapter) <- store/ <- runtime/ <- rpc/
    sinkd.evaluation     offline perplexity runs (drives the engine directly, never the daemon)
    sinkd.cli            the typer CLI
    sinkd.proto.v1       the .proto and its generated code
"""

__version__ = "0.1.0"
