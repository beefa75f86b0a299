"""The composition root: the service runner and the components (probes, controller, API) it wires
to the store and the adapters."""
