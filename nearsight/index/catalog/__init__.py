"""The gallery's catalog: one SQLite file of items, their metadata and the gallery's meta
(``store``), the row conversions (``rows``), metadata filters run as SQL (``filter``) and the
sqlite-utils connection (``sqlite_db``)."""
