"""SmolLM2-135M end to end (slow: converts the GGUF once into the kvflow cache, then ~1 s per answer)."""

from __future__ import annotations

import pytest

from backends.base import GenerateRequest, SamplingParams
from backends.local import Engine, EngineConfig

pytestmark = pytest.mark.slow


async def test_chat_completion_knows_the_capital_of_france():
    engine = Engine(EngineConfig.build(model="smollm2-135m", device_tokens=2048, host_tokens=0))
    try:
        enc = engine.tokenizer.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
        result = await engine.generate(GenerateRequest(enc.input_ids, SamplingParams(max_tokens=24)))
        assert "Paris" in result.text
        assert result.finish_reason == "stop"  # ends on <|im_end|>
        assert engine.model_config.max_position == 8192  # SmolLM2's own context
        assert engine.info()["context_length"] == 2048  # what holds: the device pool is the smaller
    finally:
        await engine.shutdown()
