"""The `sinkd` command line: a thin layer over the daemon's library API."""
