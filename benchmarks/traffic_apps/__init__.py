"""Agent-framework apps whose traffic ``benchmarks/record_framework_traffic.py`` records (issue 23's
"Measure"): each runs several sessions at once, as concurrent users would, against an
OpenAI-compatible ``--base-url`` and only speaks HTTP. Each agent's client names the ground truth
in two headers (:mod:`.shared`), which the recording proxy keeps and strips.

Run as scripts in the framework venvs ``.ci/setup-frameworks`` builds (``instrumented_langgraph_app``
in the main venv: it imports ``kvflow_orch``).
"""
