"""Test context for the pure election machine: a fake clock and a tiny in-memory lease with the same
compare-and-set rules as the real stores (acquire only if unchanged, renew only if still ours)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from sluice.coordinator.election.machine import (
    Action,
    ElectionMachine,
    ElectionTiming,
    LeaseRecord,
)

TIMING = ElectionTiming(lease_duration=15.0, renew_deadline=10.0, retry_period=2.0)


@dataclass
class MemoryLease:
    """One lease. ``version`` changes on every write; epochs come from a counter, as in Redis."""

    record: LeaseRecord | None = None
    epoch: int = 0
    writes: int = 0

    def _version(self) -> str:
        self.writes += 1
        return f"v{self.writes}"

    def acquire(self, expected: LeaseRecord | None, identity: str, address: str) -> LeaseRecord | None:
        if self.record != expected:
            return None
        self.epoch += 1
        self.record = LeaseRecord(identity, address, self.epoch, TIMING.lease_duration, self._version())
        return self.record

    def renew(self, held: LeaseRecord) -> LeaseRecord | None:
        r = self.record
        if r is None or (r.holder, r.epoch) != (held.holder, held.epoch):
            return None
        self.record = replace(r, version=self._version())
        return self.record


@dataclass
class Replica:
    """A machine plus the synchronous equivalent of the driver loop (loop.py), for simulations."""

    machine: ElectionMachine
    alive: bool = True
    elected: list[int] = field(default_factory=list)

    def step(self, lease: MemoryLease, now: float) -> None:
        m = self.machine
        if not self.alive:
            return
        action = m.poll(now)
        if action is Action.RENEW:
            held = m.held
            assert held is not None
            renewed = lease.renew(held)
            if renewed is not None:
                m.renewed(renewed, now, now)
            else:
                m.renew_lost(lease.record, now)
        elif action is Action.OBSERVE:
            record = lease.record
            if m.observed(record, now) is Action.ACQUIRE:
                won = lease.acquire(record, m.identity, m.address)
                if won is None:
                    m.acquire_lost(lease.record, now)
                elif m.acquired(won, now, now) is Action.WAIT:
                    self.elected.append(won.epoch)


def replica(name: str, timing: ElectionTiming = TIMING) -> Replica:
    return Replica(ElectionMachine(name, f"{name}.example:7600", timing))


def held_by(holder: str, version: str = "v1", *, address: str = "", epoch: int = 1) -> LeaseRecord:
    return LeaseRecord(holder, address or f"{holder}.example:7600", epoch, TIMING.lease_duration, version)
