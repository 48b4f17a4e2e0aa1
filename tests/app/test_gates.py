"""The REST API's work gates (nearsight/app/serve/gates.py): fair shares between clients."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from nearsight.app.serve.gates import GateFull, WorkGate


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


# -- the page's searches through the gates (nearsight/app/page/gated.py) ----------------------------


def test_a_gated_page_handler_shows_gradio_its_own_parameters_after_the_request():
    """Gradio fills parameters by their annotations (gr.Request, gr.EventData): the gated
    handler declares the request first, then the handler's own, and runs it with them."""
    import inspect

    import gradio as gr

    from nearsight.app.page.gated import PageGates
    from nearsight.app.serve.gates import WorkGate

    seen = []

    def handler(gallery: str, k: int, event: gr.EventData) -> str:
        seen.append((gallery, k, event))
        return f"{gallery}:{k}"

    gated = PageGates.through(WorkGate(1, 4), handler)
    parameters = list(inspect.signature(gated).parameters.values())
    assert [p.name for p in parameters] == ["nearsight_request", "gallery", "k", "event"]
    assert gated.__annotations__["nearsight_request"] is gr.Request
    from nearsight.app.page.handlers import Page  # a module with gradio imported at the top

    clicked = PageGates.through(WorkGate(1, 4), Page.clicked)
    assert clicked.__annotations__["event"] is gr.EventData
    assert inspect.iscoroutinefunction(gated)
    request = SimpleNamespace(client=SimpleNamespace(host="127.0.0.2"))
    assert asyncio.run(gated(request, "g", 3, "data")) == "g:3"
    assert seen == [("g", 3, "data")]


def test_a_gated_page_handler_waits_its_turn_and_a_flood_gets_one_line():
    """One client's events past its share of the gate are refused with a gr.Error at once;
    another client's event goes before the flood's waiting ones."""
    import gradio as gr

    from nearsight.app.page.gated import PageGates
    from nearsight.app.serve.gates import WorkGate

    order: list[str] = []
    release = threading.Event()

    def handler(name: str) -> str:
        if name == "a0":
            release.wait(10)
        order.append(name)
        return name

    gated = PageGates.through(WorkGate(1, 16, "searches", per_client=3), handler)

    def from_(client: str) -> SimpleNamespace:
        return SimpleNamespace(client=SimpleNamespace(host=client))

    async def main() -> list:
        flood = [asyncio.create_task(gated(from_("A"), f"a{n}")) for n in range(5)]
        await asyncio.sleep(0.05)
        victim = asyncio.create_task(gated(from_("B"), "b0"))
        await asyncio.sleep(0.05)
        release.set()
        return await asyncio.gather(*flood, victim, return_exceptions=True)

    answers = asyncio.run(main())
    refused = [a for a in answers if isinstance(a, gr.Error)]
    assert len(refused) == 1 and "limit per client is 3" in str(refused[0])
    assert order == ["a0", "b0", "a1", "a2", "a3"]


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


def test_a_gates_work_runs_as_its_client():
    """The work's thread sees its client in CURRENT_CLIENT (the decode box charges it there,
    for the page's events too, which run outside the request that set it)."""
    from nearsight.app.serve.clients import CURRENT_CLIENT

    gate = WorkGate(1, 4)

    async def main() -> tuple[str, str]:
        CURRENT_CLIENT.set("the request's")
        inside = await gate.run(CURRENT_CLIENT.get, "10.0.0.0/24")
        return inside, CURRENT_CLIENT.get()

    assert asyncio.run(main()) == ("10.0.0.0/24", "the request's")
