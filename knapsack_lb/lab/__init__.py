"""Instruments, not product: the loopback testbed, the demo, the fluid model and the benchmarks."""
