"""Every host keeps the same fixed prefixes under pressure: the eviction spec's scenarios
(:mod:`eviction_scenarios`, played by :mod:`eviction_spec`) on the brain, on SGLang's radix cache
with the kvflow plugin (``.venv-sglang``, ``-m sglang``) and on vLLM's block pool under
``KVFlowScheduler`` (``.venv-vllm``, ``-m vllm``). Hosts not installed here skip, naming why."""

from __future__ import annotations

import importlib.util

import pytest

from eviction_kvcache import KVCacheHost
from eviction_scenarios import SCENARIOS
from eviction_spec import EvictionHost, Scenario, play

SGLANG_MISSING = "sglang is not installed in this Python (build .venv-sglang with .ci/setup-sglang; run with -m sglang)"
VLLM_MISSING = "vLLM is not installed in this Python (build .venv-vllm with .ci/setup-vllm; run with -m vllm)"

HOSTS = [
    pytest.param("kvcache"),
    pytest.param("sglang", marks=[pytest.mark.sglang, pytest.mark.skipif(
        importlib.util.find_spec("sglang") is None, reason=SGLANG_MISSING)]),
    pytest.param("vllm", marks=[pytest.mark.vllm, pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason=VLLM_MISSING)]),
]


@pytest.fixture(scope="module", params=HOSTS)
def host(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> EvictionHost:
    if request.param == "sglang":
        from eviction_sglang import SGLangHost

        return SGLangHost()
    if request.param == "vllm":
        from eviction_vllm import VLLMHost

        return VLLMHost(tmp_path_factory.mktemp("vllm-model"))
    return KVCacheHost()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_survivors(host: EvictionHost, scenario: Scenario, request: pytest.FixtureRequest) -> None:
    missing = sorted(scenario.requires & set(host.lacks))
    if missing:
        pytest.skip(f"{host.name} lacks {', '.join(missing)}: " + "; ".join(host.lacks[m] for m in missing))
    if scenario.name in host.diverges:
        request.applymarker(pytest.mark.xfail(strict=True, reason=host.diverges[scenario.name]))
    assert play(host, scenario) == scenario.survivors, f"{host.name} breaks: {scenario.rule}"


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s.hinted], ids=lambda s: s.name)
def test_each_hinted_scenario_tells_kvflow_from_lru(scenario: Scenario) -> None:
    """The table's own check: a hinted scenario LRU also passes would pin nothing of kvflow."""
    assert play(KVCacheHost("lru"), scenario) != scenario.survivors
