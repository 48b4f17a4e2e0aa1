"""The page in Debian's chromium, driven by Playwright."""

from __future__ import annotations

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
