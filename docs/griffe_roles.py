"""A griffe extension for the API reference (mkdocs.yml): nearsight's docstrings are written
with Sphinx's roles (:func:`open_gallery`, :class:`Searcher`, :attr:`rerank`), which Markdown
shows as text; each becomes a plain code span (`open_gallery`)."""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension

ROLE = re.compile(r":(?:py:)?(?:func|meth|class|attr|mod|data|exc|obj):`~?([^`]+)`")


class SphinxRoles(Extension):
    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(r"`\1`", obj.docstring.value)
