"""The gRPC edge: the server, its listeners, health and reflection around the service.

Health is NOT_SERVING until the model has loaded and again once shutdown begins (the node says when).
"""

from __future__ import annotations

import os
import socket
import stat
import threading
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from sinkd.daemon.callers.auth import Authenticator
from sinkd.daemon.callers.limits import CallLimits
from sinkd.daemon.config import Settings
from sinkd.daemon.private import private_dir
from sinkd.daemon.rpc.guard import OpenStreams, TenantlessCalls
from sinkd.daemon.rpc.narration import NarrationServicer
from sinkd.daemon.rpc.servicer import AdminServicer, SessionsServicer
from sinkd.daemon.runtime.service import SinkdService
from sinkd.errors import ListenError
from sinkd.proto.v1 import sinkd_pb2 as pb

SERVICE_NAMES = (
    pb.DESCRIPTOR.services_by_name["Sessions"].full_name,
    pb.DESCRIPTOR.services_by_name["Admin"].full_name,
    pb.DESCRIPTOR.services_by_name["Narration"].full_name,
)


class _Undecodable:
    """A request that is not a valid message (e.g. a text field that is not UTF-8)."""

    def __init__(self, why: str) -> None:
        self.why = why


def _answers(path: Path) -> bool:
    """Whether something accepts connections on the Unix socket now (a stale one refuses)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def _register(server: grpc.Server, service: str, servicer: object) -> None:
    """Like the generated add_*_to_server, but an unparseable request is INVALID_ARGUMENT, not
    gRPC's generic INTERNAL: it is the caller's error, and it must say so."""
    descriptor = pb.DESCRIPTOR.services_by_name[service]
    handlers = {}
    for method in descriptor.methods:
        request_cls = getattr(pb, method.input_type.name)
        response_cls = getattr(pb, method.output_type.name)

        def deserialize(data: bytes, cls: Any = request_cls) -> Any:
            try:
                return cls.FromString(data)
            except DecodeError as e:
                return _Undecodable(str(e))

        behavior = getattr(servicer, method.name)
        if method.client_streaming:  # Import: the archive's pieces

            def pieces(requests: Any, context: grpc.ServicerContext, fn: Any = behavior) -> Any:
                def checked() -> Any:
                    for request in requests:
                        if isinstance(request, _Undecodable):
                            context.abort(grpc.StatusCode.INVALID_ARGUMENT, _bad_message(request))
                        yield request

                return fn(checked(), context)

            handlers[method.name] = grpc.stream_unary_rpc_method_handler(
                pieces,
                request_deserializer=deserialize,
                response_serializer=response_cls.SerializeToString,
            )
        elif method.server_streaming:

            def stream(request: Any, context: grpc.ServicerContext, fn: Any = behavior) -> Any:
                if isinstance(request, _Undecodable):
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, _bad_message(request))
                yield from fn(request, context)

            handlers[method.name] = grpc.unary_stream_rpc_method_handler(
                stream,
                request_deserializer=deserialize,
                response_serializer=response_cls.SerializeToString,
            )
        else:

            def unary(request: Any, context: grpc.ServicerContext, fn: Any = behavior) -> Any:
                if isinstance(request, _Undecodable):
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, _bad_message(request))
                return fn(request, context)

            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                unary,
                request_deserializer=deserialize,
                response_serializer=response_cls.SerializeToString,
            )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(descriptor.full_name, handlers),)
    )


def _channel_options(s: Settings) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", s.max_message_bytes),
        ("grpc.max_send_message_length", s.max_message_bytes),
        ("grpc.so_reuseport", 0),  # a second daemon on this port fails to bind, never shares it
        ("grpc.max_concurrent_streams", s.max_streams_per_connection),
        ("grpc.keepalive_time_ms", int(s.keepalive_s * 1000)),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.max_connection_idle_ms", int(s.max_connection_idle_s * 1000)),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),  # a client pinging faster
        ("grpc.http2.max_ping_strikes", 2),  # is told to go away
    ]


def _bad_message(request: _Undecodable) -> str:
    return f"the request is not a valid sinkd.v1 message (text fields must be UTF-8): {request.why}"


class GrpcFront:
    """The gRPC server of one node: Sessions, Admin, health and reflection, on the Unix socket and
    the TCP port the settings name."""

    def __init__(
        self,
        service: SinkdService,
        settings: Settings,
        authenticator: Authenticator,
        limits: CallLimits,
        ask_stop: Callable[[], None],
    ) -> None:
        self.settings = settings
        self.health = health.HealthServicer()
        self.set_serving(False)
        self.tenantless = OpenStreams(settings.max_tenantless_streams)
        self.server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=settings.rpc_workers, thread_name_prefix="sinkd-rpc"
            ),
            interceptors=[
                TenantlessCalls(
                    self.tenantless, None if settings.reflection == "open" else authenticator
                )
            ],
            maximum_concurrent_rpcs=settings.rpc_workers,  # past it: RESOURCE_EXHAUSTED, no queue
            options=_channel_options(settings),
        )
        _register(self.server, "Sessions", SessionsServicer(service, authenticator, limits))
        _register(self.server, "Admin", AdminServicer(service, authenticator, ask_stop))
        _register(self.server, "Narration", NarrationServicer(service, authenticator, limits))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        if settings.reflection != "off":
            reflection.enable_server_reflection(
                (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), self.server
            )
        self._socket_inode: int | None = None

    def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        self.health.set("", status)
        for name in SERVICE_NAMES:
            self.health.set(name, status)

    def listen(self) -> list[str]:
        """Bind the Unix socket and the TCP port (if any); the addresses bound."""
        s = self.settings
        addresses = [self._bind_unix(s.socket)]
        if s.tcp:
            if s.tls_cert and s.tls_key:
                try:
                    creds = grpc.ssl_server_credentials(
                        [(s.tls_key.read_bytes(), s.tls_cert.read_bytes())],
                        root_certificates=s.tls_client_ca.read_bytes() if s.tls_client_ca else None,
                        require_client_auth=s.tls_client_ca is not None,
                    )
                except OSError as e:
                    raise ListenError(f"TLS: {e.filename}: {e.strerror}") from None
                port = self.server.add_secure_port(s.tcp, creds)
            else:
                try:
                    port = self.server.add_insecure_port(s.tcp)
                except RuntimeError:  # grpc raises where it cannot bind at all
                    port = 0
            if not port:
                raise ListenError(f"could not listen on {s.tcp}")
            host = s.tcp.rsplit(":", 1)[0]
            addresses.append(f"{host}:{port}")
        return addresses

    def _bind_unix(self, path: Path) -> str:
        private_dir(path.parent)  # its folder: this user's alone, or refused
        if path.exists() or path.is_symlink():
            if not stat.S_ISSOCK(path.lstat().st_mode):
                raise ListenError(f"{path} exists and is not a socket; refusing to replace it")
            if _answers(path):  # a live daemon's: never removed (it would run on, unreachable)
                raise ListenError(f"a daemon already listens on {path}; stop it first")
            path.unlink()  # a stale socket from a killed daemon must not block the restart
        old = os.umask(0o177)
        try:
            port = self.server.add_insecure_port(f"unix:{path}")
        finally:
            os.umask(old)
        if not port:
            raise ListenError(f"could not listen on unix:{path}")
        os.chmod(path, 0o600)
        self._socket_inode = path.lstat().st_ino  # ours: the only socket `stop` may remove
        return f"unix:{path}"

    def remove_own_socket(self) -> None:
        path = self.settings.socket
        try:
            if self._socket_inode is not None and path.lstat().st_ino == self._socket_inode:
                path.unlink()
        except FileNotFoundError:
            pass
        self._socket_inode = None

    def start(self) -> None:
        self.server.start()

    def stop(self, grace: float) -> threading.Event:
        """Stop accepting; in-flight calls get `grace` seconds. Set when all have ended."""
        done: threading.Event = self.server.stop(grace)
        return done
