"""One module per ``kvflow`` subcommand (see :mod:`kvflow_orch.cli`)."""
