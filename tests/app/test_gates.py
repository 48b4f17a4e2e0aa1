"""The REST API's work gates (nearsight/app/rest/gates.py): fair shares between clients."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from nearsight.app.rest.gates import GateFull, WorkGate


def _run_flood(gate: WorkGate, flood: int, victims: list[str]) -> list[str]:
    """``flood`` pieces of work from "A" queued first, then one from each victim: the order in
    which the pieces started."""
    started: list[str] = []
    go = threading.Event()  # the first piece holds its slot until every request is queued

    def work(name: str):
        def piece() -> None:
            started.append(name)
            go.wait(5)

        return piece

    async def main() -> None:
        tasks = [asyncio.create_task(gate.run(work("A"), client="A")) for _ in range(flood)]
        await asyncio.sleep(0.05)
        tasks += [asyncio.create_task(gate.run(work(v), client=v)) for v in victims]
        await asyncio.sleep(0.05)
        go.set()
        await asyncio.gather(*tasks)

    asyncio.run(main())
    return started


def test_a_flood_waits_behind_its_own_requests():
    """40 pieces from A queued first, then one from B and one from C: theirs start right after
    the piece that was running (before: one queue in arrival order, 40th and 41st)."""
    started = _run_flood(WorkGate(1, 64, per_client=64), 40, ["B", "C"])
    assert started[0] == "A" and sorted(started[1:3]) == ["B", "C"], started[:6]
    assert len(started) == 42


def test_one_client_may_hold_only_its_share_of_the_queue():
    gate = WorkGate(1, 64)  # a quarter each: 16

    async def main() -> tuple[int, list[str]]:
        hold = asyncio.Event()
        loop = asyncio.get_running_loop()

        def block() -> None:
            asyncio.run_coroutine_threadsafe(hold.wait(), loop).result(5)

        running = asyncio.create_task(gate.run(block, client="A"))
        await asyncio.sleep(0.05)
        waiting = [asyncio.create_task(gate.run(lambda: None, client="A")) for _ in range(20)]
        await asyncio.sleep(0.05)
        other = asyncio.create_task(gate.run(lambda: "served", client="B"))
        await asyncio.sleep(0.05)
        hold.set()
        results = await asyncio.gather(running, *waiting, other, return_exceptions=True)
        refused = sum(isinstance(r, GateFull) for r in results)
        return refused, [r for r in results if isinstance(r, str)]

    refused, served = asyncio.run(main())
    assert refused == 4 and served == ["served"]


def test_a_cancelled_wait_gives_its_turn_away():
    gate = WorkGate(1, 8)

    async def main() -> str:
        running = asyncio.create_task(gate.run(lambda: time.sleep(0.1), client="A"))
        await asyncio.sleep(0.01)
        gone = asyncio.create_task(gate.run(lambda: None, client="B"))
        await asyncio.sleep(0.01)
        gone.cancel()
        later = await asyncio.wait_for(gate.run(lambda: "ok", client="C"), 5)
        await running
        with pytest.raises(asyncio.CancelledError):
            await gone
        return later

    assert asyncio.run(main()) == "ok"
    assert gate.running == 0 and gate.waiting == 0
