"""The page in Debian's chromium, driven by Playwright."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 60_000  # the 2-core test machine is shared: be patient, not flaky


def upload(page, path: Path | str) -> None:
    page.set_input_files("#ns-query-image input[type=file]", str(path))


ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
VIEWPORT = {"width": 1400, "height": 1100}


@contextlib.contextmanager
def open_tab(
    context, request, url: str | None = None, *, ready: str | None = None, navigate: bool = True
):
    """A new tab of the Playwright browser context ``context`` for one test (``request``: the
    test's pytest request), patient (:data:`TIMEOUT_MS`); ``tab.outside`` lists the requests
    that left ``url``'s server (data: and blob: URLs stay inside), those of the context's
    earlier tabs included (``context.requests``, kept by the ``browser_context`` fixture).
    With ``url`` (and ``navigate``) it opens it, and waits for the selector ``ready`` when
    given. If the test failed, the tab's screenshot is saved to
    test-artifacts/<test>.png; the tab is closed either way."""
    tab = context.new_page()
    tab.set_default_timeout(TIMEOUT_MS)
    tab.outside = []
    if url is not None:
        inside = (url.rstrip("/"), "data:", "blob:")
        earlier = list(getattr(context, "requests", []))
        tab.outside = [seen for seen in earlier if not seen.startswith(inside)]
        tab.on("request", lambda req: None if req.url.startswith(inside)
               else tab.outside.append(req.url))  # fmt: skip
    failed_before = request.session.testsfailed
    try:
        if url is not None and navigate:
            tab.goto(url)
            if ready is not None:
                tab.wait_for_selector(ready)
        yield tab
    finally:
        try:
            if request.session.testsfailed > failed_before:  # the call phase was reported
                ARTIFACTS.mkdir(exist_ok=True)
                name = re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)
                tab.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
        finally:
            tab.close()
