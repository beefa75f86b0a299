"""knapsack-lb: a performance-aware meta load balancer after KnapsackLB.

Probes measure each backend's (DIP's) application latency, a controller learns a
weight-latency curve per DIP and solves for the weights that minimise latency, and
adapters push those weights into an existing load balancer.
"""

__version__ = "0.1.0"
