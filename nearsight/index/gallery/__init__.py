"""The gallery folder: its reader (``core``), writers (``write``, ``segments``), files, lock,
the one builder (``build``), keys and the model it was built with."""
