"""The pure StreamingLLM cache policy: which cells a sequence keeps and where they sit.

No engine, no network: this package imports neither ``llama_cpp`` nor ``grpc``.
"""

from sinkd.cachepolicy.config import PolicyConfig, PolicyName, PositionMode
from sinkd.cachepolicy.plan import AppendPlan, Evict, Op, SeqState, Shift, SubBatch, plan_append
from sinkd.cachepolicy.policy_errors import CacheFull, CannotRewind, ConfigError
from sinkd.cachepolicy.sequence import CacheSequence, Cell, Receipt, TraceEvent
from sinkd.errors import SinkdError

__all__ = [
    "AppendPlan",
    "CacheFull",
    "CacheSequence",
    "CannotRewind",
    "Cell",
    "ConfigError",
    "Evict",
    "Op",
    "PolicyConfig",
    "PolicyName",
    "PositionMode",
    "Receipt",
    "SeqState",
    "Shift",
    "SinkdError",
    "SubBatch",
    "TraceEvent",
    "plan_append",
]
