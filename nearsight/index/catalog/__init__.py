"""The gallery's catalog: one SQLite file of items, their metadata and the gallery's meta
(``store``), the row conversions (``rows``), metadata filters parsed (``filters``), typed by
their columns (``filter_types``) and run as SQL (``filter_sql``) or on column arrays (``columns``, read by
``column_read``, kept by ``column_cache``, evaluated by ``column_filter``), and the
sqlite-utils connection (``sqlite_db``)."""
