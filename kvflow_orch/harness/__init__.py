"""The harness: library code that puts hosts and the orchestrator together to measure and run them.

A composition layer beside the CLI (:mod:`kvflow_orch.cli`): the ``kvflow`` sub-commands parse
flags and call these modules, and benchmarks, examples and tests import them directly, never
through the CLI. The harness may import every host; no host and no other orchestrator module
imports it, and it never imports the CLI.

* :mod:`.scenarios` — the simulator's workloads compiled from the bundled workflows, the standard sweep.
* :mod:`.sweep` — scenarios (workload x hardware x model) and every system run on each.
* :mod:`.report` / :mod:`.targets` — a sweep's table, JSON and plots; the paper's targets (PASS/FAIL).
* :mod:`.calibrate` — the embedded engine measured into a hardware profile, and the simulator checked against it.
* :mod:`.demo` — one workflow on a fresh embedded engine with its counters (``kvflow demo``, the examples).
* :mod:`.console` — live per-node progress and plain-or-rich tables.
* :mod:`.cluster` — local ``kvflow serve`` workers behind SGLang's model gateway, supervised.

Importing this package loads none of them (the GPU check imports :mod:`.calibrate` alone).
"""
