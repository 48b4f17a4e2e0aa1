"""The gallery folder: its reader (``core``), writers (``write``, ``segments``), files, lock,
the one builder (``build``), the typed add and remove jobs (``update``), keys and the model it
was built with."""
