"""kvflow inside vLLM (no fork): workflow-aware order of vLLM's prefix-cache free queue, hints,
and the ``/kvflow/v1`` routes on vLLM's own OpenAI server.

Pieces and the process each runs in:

* :mod:`.scheduler` (engine core, ``--scheduler-cls``): :class:`KVFlowScheduler` applies hints and
  steps to the brain's hint table and keeps tagged prefix blocks in the brain's eviction order;
* :mod:`.plugin` (``vllm.general_plugins`` entry point ``kvflow``, every vLLM process): gives
  ``EngineCore`` the ``kvflow_call`` utility the API server reaches the scheduler through;
* :mod:`.routes` (``vllm.endpoint_plugins`` entry point ``kvflow``, API server): the routes, and
  hints sent as ``custom_params.kvflow`` moved to ``kv_transfer_params.kvflow``;
* :mod:`.launcher` (``kvflow serve --engine vllm``): the ``vllm serve`` command line;
* :mod:`.offload` (CUDA only): the host tier's eviction order through vLLM's offloading policy seam.

Importing this package imports nothing from vLLM.
"""

from __future__ import annotations

__all__ = ["POLICY_NAME", "PLUGIN_NAME", "SCHEDULER_CLS", "CONFIG_ENV", "UTILITY"]

POLICY_NAME = "kvflow"
PLUGIN_NAME = "kvflow"  # the name of both entry points; VLLM_PLUGINS allows plugins by name
SCHEDULER_CLS = "backends.vllm_kvflow.scheduler.KVFlowScheduler"
CONFIG_ENV = "KVFLOW_VLLM_CONFIG"  # JSON CacheConfig options for the scheduler (the launcher sets it)
UTILITY = "kvflow_call"  # the EngineCore method the API server calls
