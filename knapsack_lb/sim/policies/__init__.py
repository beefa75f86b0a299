"""Data-plane policies (shared by the simulator and the testbed): one ``pick`` per request.

See :mod:`knapsack_lb.sim.policies.base` for the protocol.
"""
