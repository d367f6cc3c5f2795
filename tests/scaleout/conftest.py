"""Three in-process kvflow workers behind a real smg gateway, shared by a module's tests."""

from __future__ import annotations

from contextlib import ExitStack
from typing import Iterator

import pytest

from scaleout_helpers import Gateway, in_process_worker, require_smg, smg_gateway


@pytest.fixture(scope="module")
def gateway() -> Iterator[Gateway]:
    """Three in-process workers (their observers see each request's hint and each steps update)
    behind smg's manual policy."""
    require_smg()
    with ExitStack() as stack:
        workers = [stack.enter_context(in_process_worker()) for _ in range(3)]
        url = stack.enter_context(smg_gateway([w.url for w in workers]))
        yield Gateway(url, workers)


