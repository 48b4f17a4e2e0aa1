"""The REST API's work gates (nearsight/app/rest/gates.py): fair shares between clients."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from types import SimpleNamespace

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


# -- the page's queue (nearsight/app/serve/fair_queue.py) ---------------------------------------


def _event(client: str, name: str) -> SimpleNamespace:
    return SimpleNamespace(request=SimpleNamespace(client=SimpleNamespace(host=client)), _id=name)


def test_the_page_queue_places_a_new_client_in_turn():
    """Gradio runs a group's events from the front of its list: a victim's event goes after
    the flood's first waiting one, not after all of them; the flood's next goes last."""
    from nearsight.app.serve.fair_queue import fair_position

    waiting = [_event("A", f"a{n}") for n in range(10)]
    assert fair_position(waiting, "B") == 1
    waiting.insert(1, _event("B", "b0"))
    assert fair_position(waiting, "C") == 2  # after A's and B's first
    assert fair_position(waiting, "A") == len(waiting)
    assert fair_position(waiting, "B") == 3  # B's second: after A's second


def test_the_page_queue_caps_each_client_and_reorders_what_gradio_appended():
    from nearsight.app.serve.fair_queue import share_fairly

    group = SimpleNamespace(queue=[])
    queue = SimpleNamespace(event_queue_per_concurrency_id={"search": group})

    async def push(body, request, username):  # Gradio's: appends the event, names it
        group.queue.append(SimpleNamespace(request=request, _id=body))
        return True, body, "success"

    queue.push = push
    share_fairly(queue, per_client=4)

    def from_(client: str) -> SimpleNamespace:
        return SimpleNamespace(client=SimpleNamespace(host=client))

    async def main() -> list:
        answers = [await queue.push(f"a{n}", from_("A"), None) for n in range(6)]
        answers.append(await queue.push("b0", from_("B"), None))
        return answers

    answers = asyncio.run(main())
    assert [ok for ok, _, _ in answers] == [True] * 4 + [False, False] + [True]
    assert answers[4][2] == "queue_full" and "at most 4 per client" in answers[4][1]
    assert [event._id for event in group.queue] == ["a0", "b0", "a1", "a2", "a3"]


# -- files in the page's queue payloads (nearsight/app/serve/queue_files.py) -------------------


def test_queue_files_are_found_at_any_depth_and_held_to_the_upload_rules(tmp_path):
    """A data: URL is stored in the upload folder and charged to its client, the payload then
    names the file; a non-image, one over the limit and a URL to fetch are refused in one line;
    a payload nested 100,000 deep is walked without recursion."""
    import base64

    from nearsight.app.serve.queue_files import QueueFileRefused, files_in, hold_files
    from nearsight.app.serve.uploads import UploadBudget

    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 100
    budget = UploadBudget.for_limit(1000, 5.0, upload_dir=tmp_path)

    def pasted(data: bytes) -> dict:
        return {"url": "data:image/png;base64," + base64.b64encode(data).decode(), "path": None}

    data = ["gallery", pasted(png), 8, [{"x": pasted(png)}]]
    asyncio.run(hold_files(data, "A", budget))
    for file in (data[1], data[3][0]["x"]):
        assert file["url"] is None and Path(file["path"]).read_bytes() == png
        assert Path(file["path"]).is_relative_to(tmp_path)
    assert budget.held("A") == len(png)  # one file: the same bytes are stored once
    refusals = {
        "not an image": pasted(b"GIF? no" * 10),
        "larger than the server's limit": pasted(b"\x89PNG\r\n\x1a\n" + b"\0" * 1000),
        "not base64": {"url": "data:image/png;base64,@@@@", "path": None},
        "upload route": {"path": "https://example.com/q.png"},
    }
    for fragment, file in refusals.items():
        with pytest.raises(QueueFileRefused, match=fragment) as refused:
            asyncio.run(hold_files([file], "A", budget))
        assert "\n" not in str(refused.value)
    deep: list = [pasted(png)]
    for _ in range(100_000):
        deep = [deep]
    assert len(files_in(deep)) == 1
