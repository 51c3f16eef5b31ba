"""WorkerLease: one coordinator at a time, with injected time."""

from __future__ import annotations

import pytest

from hydra_node.runtime.rpc import LeaseHeld, LeaseNotHeld, WorkerLease


def test_one_coordinator_at_a_time():
    lease = WorkerLease("w1")
    assert lease.holder() is None
    lease.acquire("c1")
    lease.acquire("c1")  # renewing is fine
    with pytest.raises(LeaseHeld, match="leased to coordinator 'c1'") as exc:
        lease.acquire("c2")
    assert (exc.value.holder, exc.value.requester) == ("c1", "c2")
    with pytest.raises(LeaseNotHeld):
        lease.release("c2")
    lease.release("c1")
    lease.acquire("c2")
    assert lease.holder() == "c2"


def test_release_without_lease_and_empty_id():
    lease = WorkerLease("w1")
    with pytest.raises(LeaseNotHeld):
        lease.release("c1")
    with pytest.raises(ValueError):
        lease.acquire("")


def test_ttl_expiry_and_renewal():
    lease = WorkerLease("w1", ttl_s=10.0)
    lease.acquire("c1", now=100.0)
    with pytest.raises(LeaseHeld):
        lease.acquire("c2", now=109.9)
    lease.acquire("c1", now=109.0)  # renew until 119
    with pytest.raises(LeaseHeld):
        lease.acquire("c2", now=115.0)
    assert lease.holder(now=119.0) is None
    lease.acquire("c2", now=119.0)
    with pytest.raises(LeaseNotHeld):
        lease.release("c1", now=119.5)


def test_revoke_on_worker_restart():
    lease = WorkerLease("w1")
    lease.acquire("c1")
    assert lease.revoke() == "c1" and lease.holder() is None
    lease.acquire("c2")
