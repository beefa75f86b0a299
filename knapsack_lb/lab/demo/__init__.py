"""`klb demo`: KnapsackLB on a live loopback testbed (the project's main job).

Modules: :mod:`settings` (every knob of the run), :mod:`loadgen` (the open-loop layer-4 client,
run as a subprocess), :mod:`testbed` (Redis, emulated DIPs, HAProxy, the generated config),
:mod:`phases` (what each phase sets up), :mod:`runner` (drives the phases), :mod:`live` (terminal
view), :mod:`report` (metrics, table, report.json, plot). docs/demo.md explains the workload.
"""
