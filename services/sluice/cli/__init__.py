"""The ``sluice`` command."""
