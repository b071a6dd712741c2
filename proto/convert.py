"""Receipts and trace events between the daemon's plain dicts and protobuf, both ways, written once.

The dicts are what `Session.receipt()` and `TraceEvent.as_dict()` give (ranges as [start, end], the
policy as a dict named by `policy`); the messages are `sinkd.v1.Receipt` and `sinkd.v1.TraceEvent`.
Fields are matched by name through the message descriptors, so a field added to both sides needs no
code here.
"""

from __future__ import annotations

from typing import Any

from sinkd.proto.v1 import sinkd_pb2 as pb

_POLICY_KEYS = {"name": "policy"}  # Policy message field -> key in the policy dict


def _is(field: Any, message: Any) -> bool:
    return (
        field.message_type is not None
        and field.message_type.full_name == message.DESCRIPTOR.full_name
    )


def _message_class(field: Any) -> Any:
    return getattr(pb, field.message_type.name)


def _value_to_pb(field: Any, value: Any) -> Any:
    if _is(field, pb.Range):
        return pb.Range(start=value[0], end=value[1])
    if field.message_type is not None:
        return _to_pb(value, _message_class(field))
    return value


def _to_pb(d: dict[str, Any], cls: Any) -> Any:
    kwargs: dict[str, Any] = {}
    for field in cls.DESCRIPTOR.fields:
        value = (
            d.get(_POLICY_KEYS.get(field.name, field.name))
            if cls is pb.Policy
            else d.get(field.name)
        )
        if value is None:
            continue
        if field.is_repeated:
            kwargs[field.name] = [_value_to_pb(field, v) for v in value]
        else:
            kwargs[field.name] = _value_to_pb(field, value)
    return cls(**kwargs)


def _value_from_pb(field: Any, value: Any) -> Any:
    if _is(field, pb.Range):
        return [int(value.start), int(value.end)]
    if field.message_type is not None:
        return _from_pb(value)
    return value


def _from_pb(message: Any) -> dict[str, Any]:
    d: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        key = (
            _POLICY_KEYS.get(field.name, field.name)
            if isinstance(message, pb.Policy)
            else field.name
        )
        value = getattr(message, field.name)
        if field.is_repeated:
            d[key] = [_value_from_pb(field, v) for v in value]
        elif field.message_type is not None or field.has_presence:
            d[key] = _value_from_pb(field, value) if message.HasField(field.name) else None
        else:
            d[key] = value
    return d


def to_pb(d: dict[str, Any], cls: Any) -> Any:
    """Any of our messages from its dict (nested messages and ranges included)."""
    return _to_pb(d, cls)


def from_pb(message: Any) -> dict[str, Any]:
    return _from_pb(message)


def receipt_to_pb(receipt: dict[str, Any]) -> pb.Receipt:
    message: pb.Receipt = _to_pb(receipt, pb.Receipt)
    return message


def receipt_from_pb(message: pb.Receipt) -> dict[str, Any]:
    return _from_pb(message)


def trace_to_pb(event: dict[str, Any]) -> pb.TraceEvent:
    message: pb.TraceEvent = _to_pb(event, pb.TraceEvent)
    return message


def trace_from_pb(message: pb.TraceEvent) -> dict[str, Any]:
    return _from_pb(message)
