"""sqlite-utils' :class:`Database`, imported without pandas.

sqlite-utils imports pandas whenever it is installed, only to map ``pandas.Timestamp`` to a TEXT
column, which the catalog never stores. Loading pandas costs the serving path about a third of
a second and tens of MB (bench/cli_search.py), so it is hidden while sqlite-utils loads; a later
``import pandas`` (Gradio's) works as usual.
"""

from __future__ import annotations

import sys

if "pandas" in sys.modules or "sqlite_utils" in sys.modules:
    from sqlite_utils import Database
else:
    sys.modules["pandas"] = None  # type: ignore[assignment]  # `import pandas` raises ImportError
    try:
        from sqlite_utils import Database
    finally:
        del sys.modules["pandas"]

__all__ = ["Database"]
