"""Kernel receive timestamps of TCP data (Linux ``SO_TIMESTAMPNS``), for the emulator and the probes.

asyncio's transports drop ancillary data, so a socket that wants to know when bytes reached it
(not when the process got round to reading them) is read with ``recvmsg`` and this module's
helpers. Elsewhere :func:`enable_timestamps` returns False and callers time at the read.
"""

from __future__ import annotations

import socket
import struct
import sys
import time

# Linux <asm-generic/socket.h>: SO_TIMESTAMPNS (_OLD) = SCM_TIMESTAMPNS = 35, a struct timespec
# of two native longs; Python's socket module does not export the constant.
SO_TIMESTAMPNS = 35
_TIMESPEC = struct.Struct("@ll")
ANCILLARY_BYTES = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0


def enable_timestamps(sock: socket.socket) -> bool:
    """Ask the kernel to stamp received data on ``sock``; False where it cannot (not Linux)."""
    if not sys.platform.startswith("linux") or not ANCILLARY_BYTES:
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def receive_with_timestamp(sock: socket.socket, size: int, stamped: bool = True) -> tuple[bytes, int]:
    """Read up to ``size`` bytes; the data and its kernel receive time in ``time.time_ns()`` units
    (0 when the kernel gave none, or ``stamped`` is False: a plain ``recv``). Raises what the
    read raises."""
    if not stamped:
        return sock.recv(size), 0
    data, ancillary, _flags, _address = sock.recvmsg(size, ANCILLARY_BYTES)
    kernel_ns = 0
    for level, kind, value in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(value) >= _TIMESPEC.size:
            seconds, nanoseconds = _TIMESPEC.unpack_from(value)
            kernel_ns = seconds * 1_000_000_000 + nanoseconds
    return data, kernel_ns


def seconds_since(kernel_ns: int) -> float:
    """How long ago (real-time clock) the kernel stamped data, in seconds; 0.0 for no stamp."""
    return (time.time_ns() - kernel_ns) * 1e-9 if kernel_ns else 0.0
