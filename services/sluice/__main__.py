"""``python -m sluice``: the same entry point as the ``sluice`` command (the tests and containers use it)."""

from sluice.cli.main import main

raise SystemExit(main())
