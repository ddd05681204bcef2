"""Bounded network waits: reach an address within a timeout or raise a clear error.

Connecting to a Ray cluster (``--executor ray --address``) or to a process group's rendezvous
(``MASTER_ADDR``/``MASTER_PORT``) goes through :func:`reach` first: the host name is resolved
(in a helper thread, so that a slow resolver cannot hold the caller past the timeout) and a TCP
connection is tried, again every half second while it is refused, until ``timeout`` seconds have
passed. A name that does not resolve fails at once; a port nobody listens on fails at the
timeout; either raises a :class:`~agentsim.errors.NetworkError` naming the address. A Ray
address is then asked for the start of a gRPC conversation (:func:`speaks_grpc`) under the same
timeout: a server that accepts but is not Ray would otherwise hold Ray's own connect for minutes.

Examples:
    >>> split_address("ray://10.0.0.5:10001"), split_address("[::1]:6379"), split_address("head:6379")
    (('10.0.0.5', 10001), ('::1', 6379), ('head', 6379))
"""

from __future__ import annotations

import os
import socket
import threading
import time

from agentsim.errors import ConfigError, NetworkError

__all__ = ["DEFAULT_CONNECT_TIMEOUT", "check_connect_timeout", "reach", "speaks_grpc", "split_address"]

DEFAULT_CONNECT_TIMEOUT = 15.0
_RETRY_SECONDS = 0.5


def check_connect_timeout(timeout: float) -> float:
    """Validate a connect timeout in seconds (> 0)."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ConfigError(f"connect timeout: expected seconds > 0 (got {timeout!r})")
    return float(timeout)


def split_address(address: str) -> tuple[str, int]:
    """``"[scheme://]host:port"`` to ``(host, port)``; a ConfigError for anything else."""
    rest = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = rest.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"address: expected HOST:PORT (got {address!r})")
    return host, int(port)


def _resolve(host: str, port: int, timeout: float) -> list[tuple]:
    """``getaddrinfo`` with a deadline (it has none of its own)."""
    got: list[list[tuple]] = []
    failed: list[BaseException] = []

    def work() -> None:
        try:
            got.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as e:
            failed.append(e)

    thread = threading.Thread(target=work, name="agentsim-resolve", daemon=True)
    thread.start()
    thread.join(timeout)
    if failed:
        raise failed[0]
    if not got:
        raise TimeoutError(f"resolving the name took more than {timeout:g} s")
    return got[0]


def reach(address: str, timeout: float = DEFAULT_CONNECT_TIMEOUT, what: str | None = None) -> None:
    """Return once a TCP connection to ``address`` (``host:port``) succeeds; a NetworkError
    (starting with ``what``, default the address) if the host does not resolve or nothing
    accepts within ``timeout`` seconds.
    """
    timeout = check_connect_timeout(timeout)
    host, port = split_address(address)
    what = what or f"address {address!r}"
    deadline = time.monotonic() + timeout
    try:
        infos = _resolve(host, port, timeout)
    except (OSError, TimeoutError) as e:
        raise NetworkError(f"{what}: cannot resolve host name {host!r} ({e})") from None
    last: OSError | None = None
    while True:
        for family, kind, proto, _, sockaddr in infos:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                with socket.socket(family, kind, proto) as s:
                    s.settimeout(min(left, 5.0))
                    s.connect(sockaddr)
                return
            except OSError as e:
                last = e
        left = deadline - time.monotonic()
        if left <= 0.01:
            break
        time.sleep(min(_RETRY_SECONDS, left - 0.01))
    reason = os.strerror(last.errno) if last is not None and last.errno else (str(last) or "timed out")
    raise NetworkError(f"{what}: nothing accepted a connection within {timeout:g} s "
                       f"(last attempt: {reason}); is the server running and the port right?")


_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # + empty SETTINGS
_SETTINGS = 0x4  # an HTTP/2 frame's type: a server's first frame is its SETTINGS


def speaks_grpc(address: str, timeout: float = DEFAULT_CONNECT_TIMEOUT, what: str | None = None) -> None:
    """Return once the server at ``address`` answers the start of an HTTP/2 (gRPC) conversation
    (its first frame, SETTINGS) within ``timeout`` seconds; a NetworkError otherwise. Skipped
    where Ray speaks TLS (``RAY_USE_TLS``), whose handshake comes first.
    """
    if os.environ.get("RAY_USE_TLS", "0").strip().lower() in ("1", "true", "yes"):
        return
    timeout = check_connect_timeout(timeout)
    host, port = split_address(address)
    what = what or f"address {address!r}"
    deadline = time.monotonic() + timeout
    got = b""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(_HTTP2_PREFACE)
            while len(got) < 9:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                s.settimeout(left)
                chunk = s.recv(9 - len(got))
                if not chunk:
                    break
                got += chunk
    except OSError:
        pass
    if len(got) < 9 or got[3] != _SETTINGS:
        heard = "closed the connection" if len(got) < 9 and time.monotonic() < deadline else (
            f"did not answer within {timeout:g} s" if len(got) < 9 else f"answered {got[:9]!r}")
        raise NetworkError(f"{what}: something accepts connections there but {heard} as a gRPC server "
                           "would: not a Ray cluster? (Ray's address is its head's GCS port, 6379 by default, "
                           "or ray://HOST:10001 for the Ray client)")

