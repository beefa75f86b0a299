"""Loopback testbed instruments: emulated backends whose capacity and latency are known.

These are test and demo instruments, not part of the control path:

* :mod:`knapsack_lb.lab.testbed.emulator`: the HTTP/1.1 backend emulator (``Emulator``,
  ``EmulatorConfig``, the in-process ``EmulatorFleet``; ``python -m
  knapsack_lb.lab.testbed.emulator`` runs it as a subprocess);
* :mod:`knapsack_lb.lab.testbed.queueing`: its FCFS / processor-sharing service model.

Import from those modules (this package imports nothing, so ``python -m`` stays clean).
"""
