"""Weight-pushing plugins: one module per load balancer, found through the entry-point
group ``knapsack_lb.adapters`` (see :mod:`adapters.base`)."""
