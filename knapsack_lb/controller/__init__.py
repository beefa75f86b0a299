"""The controller core: one pure ``VipController.step`` per VIP and the parts it is made of
(measurement, scheduling, dynamics, breaker, rails, settings). Imports neither adapters nor probes."""
