"""The background scrub (broker/scrub.py) over a real log on disk: it walks every sealed segment once per
pass (never the active one), steps over a damaged batch it finds (joined to ``corrupt_ranges``, the log's
listener told, the damage counted once), and a new pass starts only after the interval."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sluice.broker.log.manager import LogManager
from sluice.broker.scrub import Scrubber
from sluice.codec.batch import iter_headers

from .helpers import make_batch, small_config


def _flip(log_file: Path, which: int) -> tuple[int, int]:
    pos, header = list(iter_headers(log_file.read_bytes()))[which]
    with log_file.open("r+b") as f:
        f.seek(pos + header.length - 1)
        byte = f.read(1)[0]
        f.seek(pos + header.length - 1)
        f.write(bytes([byte ^ 0x01]))
    return header.base_offset, header.next_offset


def _pass(scrubber: Scrubber) -> int:
    async def run() -> int:
        total = 0
        for _ in range(10_000):
            n = await scrubber.step()
            if not n:
                return total
            total += n
        raise AssertionError("the pass did not end")

    return asyncio.run(run())


def test_a_pass_verifies_the_sealed_segments_and_finds_the_damage_once(tmp_path: Path) -> None:
    logs = LogManager(tmp_path, small_config(segment_bytes=2048))
    plog = logs.create("t", "tid", 0)
    for i in range(40):
        plog.append(make_batch(3, value_size=60, seed=i))
    bases = plog.segment_base_offsets()
    assert len(bases) >= 4
    sealed = sorted((tmp_path / "t-0").glob("*.log"))[1]
    bad = _flip(sealed, 0)
    heard: list[str] = []
    logs.on_damage = lambda topic, partition: heard.append(topic)
    damaged: list[int] = []
    read: list[int] = []
    now = [0.0]
    scrubber = Scrubber(
        logs, 1 << 30, 60.0, on_bytes=read.append, on_damage=damaged.append, clock=lambda: now[0]
    )
    scrubbed = _pass(scrubber)
    sealed_bytes = sum(p.stat().st_size for p in sorted((tmp_path / "t-0").glob("*.log"))[:-1])
    assert plog.corrupt_ranges == [bad]
    assert damaged == [1]
    assert heard
    # Every sealed byte but the damaged batch was read; the active segment was not.
    assert sealed_bytes - (bad[1] - bad[0]) * 200 <= sum(read) <= sealed_bytes
    assert scrubbed >= sum(read)
    assert _pass(scrubber) == 0  # nothing new until the interval passes
    logs.close()
