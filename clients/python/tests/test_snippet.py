"""The issue's snippet, as written, against a real ``palisade serve``: the contract of the
package's surface."""

from __future__ import annotations

import asyncio

from servers import PalisadeServer


def test_the_snippet_runs_against_a_real_server(server: PalisadeServer) -> None:
    from palisade import Client, LeaseLostError, LockHeldError, StaleTokenError  # noqa: F401

    client = Client(server.url)
    with client.lock("snippet-orders", holder="w1", ttl_ms=5000, wait_ms=2000) as lease:
        assert (lease.epoch, lease.lease_id) == (1, lease.lease_id)
        assert lease.token.startswith("pal1.")
        assert lease.fence() == 1
        written = lease.kv.put("invoice-17", b"paid")
        assert written.epoch == 1
        assert lease.kv.get("invoice-17") == b"paid"
        assert lease.kv.get("absent") is None
        status = client.lock_status("snippet-orders")
        assert (status.holder, status.lease_id) == ("w1", lease.lease_id)
    # Leaving the block released the lease: the lock is free and the next acquire gets 2.
    assert client.lock_status("snippet-orders").holder is None
    with client.lock("snippet-orders", holder="w2", ttl_ms=5000) as second:
        assert second.epoch == 2
    client.close()


def test_the_snippet_under_asyncio(server: PalisadeServer) -> None:
    from palisade.aio import Client

    async def main() -> None:
        async with Client(server.url) as client:
            async with client.lock("snippet-aio", holder="w1", ttl_ms=5000, wait_ms=2000) as lease:
                assert lease.epoch == 1
                assert await lease.fence() == 1
                await lease.kv.put("invoice-17", b"paid")
                assert await lease.kv.get("invoice-17") == b"paid"
            assert (await client.lock_status("snippet-aio")).holder is None

    asyncio.run(main())
