"""The asyncio client against a real ``palisade serve``: the same behaviours as the
blocking client, through ``palisade.aio``."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

import pytest

from palisade.aio import (
    Client,
    IdempotencyConflictError,
    LeaseLostError,
    LockHeldError,
    RevisionMismatchError,
    StaleTokenError,
)

from servers import PalisadeServer


def run(server: PalisadeServer, body: Callable[[Client], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        async with Client(server.url) as client:
            return await body(client)

    return asyncio.run(main())


def test_lock_held_and_a_waiting_acquire(server: PalisadeServer, lock_name: str) -> None:
    async def body(client: Client) -> None:
        first = await client.acquire(lock_name, holder="first", ttl_ms=10_000)
        with pytest.raises(LockHeldError) as held:
            await client.acquire(lock_name, holder="second", ttl_ms=1000)
        assert held.value.holder == "first"

        async def waiter() -> int:
            async with client.lock(lock_name, holder="second", ttl_ms=5000, wait_ms=20_000) as lease:
                return lease.epoch

        task = asyncio.create_task(waiter())
        while (await client.lock_status(lock_name)).waiters == 0:
            await asyncio.sleep(0.01)
        await first.release()
        assert await asyncio.wait_for(task, 20) == 2

    run(server, body)


def test_renewals_keep_a_short_lease_alive(server: PalisadeServer, lock_name: str) -> None:
    async def body(client: Client) -> None:
        async with client.lock(lock_name, holder="h", ttl_ms=1000) as lease:
            assert await lease.wait_lost(timeout=2.5) is False
            assert (await client.lock_status(lock_name)).lease_id == lease.lease_id
            await lease.kv.put("k", b"still mine")

    run(server, body)


def test_a_released_lease_is_lost_and_a_stale_write_loses_the_lease(server: PalisadeServer, lock_name: str) -> None:
    async def body(client: Client) -> None:
        lease = await client.acquire(lock_name, holder="h", ttl_ms=300)
        await client.release(lease.lease_id)
        assert await lease.wait_lost(timeout=5) is True
        with pytest.raises(LeaseLostError):
            await lease.kv.put("k", b"v")

        old = await client.acquire(lock_name, holder="old", ttl_ms=30_000)
        await client.release(old.lease_id)
        async with client.lock(lock_name, holder="new", ttl_ms=30_000) as new:
            assert await new.fence() == new.epoch
            with pytest.raises(StaleTokenError) as stale:
                await old.kv.put("k", b"late")
            assert (stale.value.high_water, stale.value.epoch) == (new.epoch, old.epoch)
            assert old.lost and "stale" in (old.lost_reason or "")
            with pytest.raises(LeaseLostError):
                await old.fence()
            assert await client.kv(lock_name).get("k") is None

    run(server, body)


def test_write_options_and_reads(server: PalisadeServer, lock_name: str) -> None:
    async def body(client: Client) -> None:
        async with client.lock(lock_name, holder="h", ttl_ms=10_000) as lease:
            first = await lease.kv.put("doc", b"v1", if_absent=True, idempotency_key="op-1")
            assert (await lease.kv.put("doc", b"v1", if_absent=True, idempotency_key="op-1")).replayed
            with pytest.raises(IdempotencyConflictError):
                await lease.kv.put("doc", b"other", idempotency_key="op-1")
            with pytest.raises(RevisionMismatchError):
                await lease.kv.put("doc", b"v2", if_match=first.revision + 100)
            entry = await lease.kv.entry("doc")
            assert entry is not None and (entry.value, entry.revision) == (b"v1", first.revision)
            assert await lease.kv.list() == ["doc"]
            await lease.kv.delete("doc", if_match=first.revision)
            check = await lease.check()
            assert (check.genuine, check.current, check.lease_alive) == (True, True, True)
        assert (await client.high_water(lock_name)).high_water == 1
        assert [k.alg for k in await client.keys()] == ["Ed25519"]
        await client.health()

    run(server, body)
