"""The open galleries of a server, with one owner: :class:`Galleries` opens them, holds the
name -> gallery mapping that the page and the REST API both read, runs their live reload
(nearsight/app/serve/live.py) and closes them.

It sits below both faces: the page (nearsight/app/page/) and REST (nearsight/app/rest/) each
look a gallery up here, per request, so a gallery reloaded while serving is seen by the next
request of either. The page opens its galleries as its own kind of served gallery (its
:class:`~nearsight.app.page.view.GalleryView` adds thumbnails and the failure analysis); this
module never needs to know which kind it holds.

The serving settings that concern the galleries themselves live here too (which fields a
result card shows, the most filter conditions a search may send, paths shown or not), so
that the launcher hands the faces one object instead of reaching into either of them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Generic

from nearsight.app.serve.live import DEFAULT_INTERVAL_S, GalleryWatcher, View
from nearsight.core.errors import NearsightError
from nearsight.search.rerank.spec import RerankSpec
from nearsight.search.served import open_served


class UnknownGallery(NearsightError, LookupError):
    """A request named a gallery this server does not serve (404 on REST)."""


class Galleries(Generic[View]):
    """The galleries a server serves, by name, in the order given. ``views`` is the live
    mapping (a reload swaps an entry in one assignment); look a gallery up once per request
    with :meth:`get` and keep that view for the whole request."""

    def __init__(
        self,
        views: Sequence[View],
        *,
        max_filter_conditions: int | None = None,
    ) -> None:
        if not views:
            raise NearsightError("serve needs at least one gallery")
        self.views: dict[str, View] = {view.name: view for view in views}
        self.names = [view.name for view in views]
        self.max_filter_conditions = max_filter_conditions  # None: the filters' default
        self._watcher: GalleryWatcher[View] | None = None

    @classmethod
    def open(
        cls,
        folders: Sequence[str | os.PathLike[str]],
        model: str | os.PathLike[str] | None = None,
        *,
        device: str = "auto",
        kind: type[View],
        show_paths: bool = False,
        rerank: RerankSpec | str | None = None,
        card_fields: Sequence[str] | None = None,
        max_filter_conditions: int | None = None,
    ) -> Galleries[View]:
        """Open every gallery folder with its model (:func:`~nearsight.search.served.
        open_served`) as ``kind``, with the serving settings applied."""
        from nearsight.search.rerank.spec import parse_rerank

        spec = parse_rerank(rerank) if isinstance(rerank, str) else rerank
        views = open_served([Path(f) for f in folders], model, device, kind=kind)
        try:
            for view in views:
                view.show_paths = show_paths
                view.rerank_override = spec
                view.card_fields = list(card_fields) if card_fields else None
                if card_fields:
                    view.check_card_fields()
        except BaseException:
            for view in views:
                view.close()
            raise
        return cls(views, max_filter_conditions=max_filter_conditions)

    def get(self, name: str | None = None) -> View:
        """The gallery ``name`` (default: the first), or :class:`UnknownGallery` naming the
        ones there are."""
        if not name:
            return self.views[self.names[0]]
        try:
            return self.views[name]
        except KeyError:
            known = ", ".join(self.names)
            shown = name if len(name) <= 200 else name[:200] + "..."
            raise UnknownGallery(f"no gallery named {shown!r} (this server has: {known})") from None

    def __iter__(self) -> Iterator[View]:
        return iter(list(self.views.values()))

    def __len__(self) -> int:
        return len(self.views)

    def summaries(self) -> list[dict]:
        """Each gallery's facts (:func:`nearsight.index.gallery.summary.gallery_summary`), with the
        name it is served under and its reload count."""
        from nearsight.index.gallery.summary import gallery_summary

        return [
            {"name": view.name, "generation": view.generation, **gallery_summary(view.gallery)}
            for view in self
        ]

    # -- live reload and lifetime --------------------------------------------------------------

    def watch(self, interval: float = DEFAULT_INTERVAL_S) -> None:
        """See other processes' changes to the galleries while serving (live.py)."""
        if self._watcher is None and interval > 0:
            self._watcher = GalleryWatcher(self.views, interval)
            self._watcher.start()

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
        for view in self.views.values():
            view.close()
