"""Port picking for the servers tests and the demo start."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from knapsack_lb.lab.procs import (
    CLUSTER_BUS_OFFSET,
    ManagedProcess,
    ephemeral_port_floor,
    free_cluster_port,
    free_listening_port,
)


def test_a_cluster_nodes_bus_port_is_below_the_ephemeral_range() -> None:
    """A Redis Cluster node listens on its port and on port + 10000 (the cluster bus). A bus port
    inside the kernel's ephemeral range can be taken by any outgoing connection between the check
    and the node's bind, and the node aborts ("Failed listening on port ... (cluster)")."""
    floor = ephemeral_port_floor()
    taken: list[int] = []
    for _ in range(50):
        port = free_cluster_port(taken=taken)
        taken.append(port)
        assert port >= 1024 and port + CLUSTER_BUS_OFFSET < floor
    assert len(set(taken)) == len(taken)


def test_the_ephemeral_floor_is_the_kernels(tmp_path: Path) -> None:
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("40000\t60999\n")
    assert ephemeral_port_floor(ranges) == 40000
    assert ephemeral_port_floor(tmp_path / "missing") == 32768  # Linux's default


def test_ports_handed_out_for_servers_are_unique_and_below_the_ephemeral_range() -> None:
    """Servers started one after another get ports before any of them binds: a port handed out once
    is never handed out again, and none is one an outgoing connection could take meanwhile."""
    taken: list[int] = []
    for _ in range(200):
        taken.append(free_listening_port(taken=taken))
    assert len(set(taken)) == len(taken)
    assert all(10000 <= p < max(ephemeral_port_floor(), 12000) for p in taken)


def test_a_server_that_cannot_bind_is_not_taken_for_the_one_that_holds_its_port(tmp_path: Path) -> None:
    """Another process listens on the port: a connect succeeds, but the server started for it exits on
    its bind error, and waiting for it says so instead of returning."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        script = f"import socket; s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); input()"
        server = ManagedProcess([sys.executable, "-c", script], log_path=tmp_path / "server.log").start()
        try:
            with pytest.raises(RuntimeError, match=f"before listening on 127.0.0.1:{port}"):
                server.wait_listening("127.0.0.1", port, timeout=10.0)
        finally:
            server.stop()


def test_waiting_for_a_server_returns_once_it_listens(tmp_path: Path) -> None:
    port = free_listening_port()
    script = f"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(30)"
    server = ManagedProcess([sys.executable, "-c", script], log_path=tmp_path / "server.log").start()
    try:
        server.wait_listening("127.0.0.1", port, timeout=10.0)
        assert server.alive()
    finally:
        server.stop()
