"""Port picking for the servers tests and the demo start."""

from __future__ import annotations

from pathlib import Path

from knapsack_lb.lab.procs import CLUSTER_BUS_OFFSET, ephemeral_port_floor, free_cluster_port


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
