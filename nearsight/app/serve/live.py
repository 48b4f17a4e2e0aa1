"""Live galleries: a running server sees ``index add``, ``remove`` and ``compact`` made by other
processes, without a restart.

A :class:`GalleryWatcher` looks at each served gallery's folder once per ``interval`` seconds.
The catalog is a gallery's commit point (nearsight/index/gallery/segments.py), so a change of
the catalog file (its inode, size or mtime) or of the folder itself (``compact`` and rebuilds
rename a whole new folder into place) means a new state. The watcher then opens the gallery
again (``Gallery.open`` reads under the gallery's shared lock, so it never sees a half-applied
write) as a new served gallery of the same kind with the same embedder
(:meth:`~nearsight.search.served.ServedGallery.reopened`), and swaps it into the shared ``views`` mapping in one assignment. A search holds the view it
started with until it ends, so every answer comes from one whole state; the old view is
dropped, not closed, and goes away with its last reader.
"""

from __future__ import annotations

import os
import threading
from collections.abc import MutableMapping
from pathlib import Path
from typing import Generic, TypeVar

from nearsight.core.errors import NearsightError
from nearsight.index.catalog.store import CATALOG_FILE
from nearsight.search.served import ServedGallery

DEFAULT_INTERVAL_S = 1.0

Fingerprint = tuple[int, ...]
# the served galleries' kind (the page's own add thumbnails)
View = TypeVar("View", bound=ServedGallery)


def fingerprint(folder: Path) -> Fingerprint | None:
    """What changes whenever a writer commits to the gallery at ``folder``; None while the
    folder is missing (between the two renames of a replace)."""
    try:
        folder_stat = os.stat(folder)
        catalog = os.stat(folder / CATALOG_FILE)
    except OSError:
        return None
    return (
        folder_stat.st_ino,
        folder_stat.st_mtime_ns,
        catalog.st_ino,
        catalog.st_size,
        catalog.st_mtime_ns,
    )


class GalleryWatcher(Generic[View]):
    """Keeps ``views`` (name -> view, shared with the page and the REST API) up to date with
    the galleries on disk; :meth:`check` does one pass, :meth:`start` runs it in a thread."""

    def __init__(self, views: MutableMapping[str, View], interval: float = DEFAULT_INTERVAL_S):
        self.views = views
        self.interval = interval
        self._seen = {name: fingerprint(view.gallery.path) for name, view in views.items()}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> list[str]:
        """Reload every gallery whose files changed since the last pass; returns their names.
        A gallery that cannot be opened now (a writer's rename in between, a damaged file)
        keeps serving its last good state and is tried again next pass."""
        swapped = []
        for name, view in list(self.views.items()):
            now = fingerprint(view.gallery.path)
            if now is None or now == self._seen.get(name):
                continue
            try:
                fresh = view.reopened()
            except NearsightError as error:
                print(f"nearsight: gallery {name} changed but cannot be read yet: {error}",
                      flush=True)  # fmt: skip
                continue
            self._seen[name] = now
            self.views[name] = fresh
            swapped.append(name)
        return swapped

    def start(self) -> None:
        def run() -> None:
            while not self._stop.wait(self.interval):
                self.check()

        self._thread = threading.Thread(target=run, name="nearsight-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
