"""The gallery's catalog: one SQLite file of items, their metadata and the gallery's meta
(``store``), the row conversions (``rows``), metadata filters parsed and run as SQL (``filters``) and the
sqlite-utils connection (``sqlite_db``)."""
