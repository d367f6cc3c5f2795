"""``python -m kvflow_orch.cli``: the ``kvflow`` command."""

from . import main

raise SystemExit(main())
