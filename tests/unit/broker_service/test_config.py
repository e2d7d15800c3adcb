"""``sluice broker`` configuration: flags > env > file > defaults, validated."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from sluice.broker.config import BrokerConfig
from sluice.broker.flusher import FlushPolicy
from sluice.broker.main import main, parse_config
from sluice.errors import InvalidArgument


def test_defaults() -> None:
    cfg = BrokerConfig()
    assert (cfg.port, cfg.metrics_port, cfg.flush_policy) == (7601, 9601, FlushPolicy.INTERVAL)
    assert cfg.coordinator == ""  # standalone unless told otherwise
    log = cfg.log_defaults()
    assert log.retention_bytes == -1  # 0 in the broker config means unlimited
    assert log.retention_ms == 7 * 24 * 3600 * 1000
    caps = cfg.fetch_caps()
    assert caps.max_wait_ms == 30_000
    assert caps.max_bytes == 64 * 1024 * 1024


def test_flags_env_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "broker.toml"
    conf.write_text('flush = "never"\nsegment_bytes = "1MiB"\nbroker_id = 3\n')
    monkeypatch.setenv("SLUICE_BROKER_FLUSH", "always")
    monkeypatch.setenv("SLUICE_BROKER_RETENTION_AGE", "0")
    cfg = parse_config(
        ["--config", str(conf), "--port", "0", "--flush-interval", "250ms", "--broker-id", "7"]
    )
    assert cfg.broker_id == 7  # flag beats file
    assert cfg.flush_policy is FlushPolicy.ALWAYS  # env beats file
    assert cfg.segment_bytes == 1 << 20
    assert cfg.flush_interval == timedelta(milliseconds=250)
    assert cfg.log_defaults().retention_ms == -1


def test_bad_settings_are_refused_with_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(InvalidArgument, match="always, interval or never"):
        BrokerConfig(flush="sometimes")
    with pytest.raises(InvalidArgument, match="segment_bytes"):
        BrokerConfig(segment_bytes=0)
    conf = tmp_path / "broker.toml"
    conf.write_text("no_such_setting = 1\n")
    assert main(["--config", str(conf)]) == 2
    assert "no_such_setting" in capsys.readouterr().err
    assert main(["--broker-id", "-1"]) == 2
