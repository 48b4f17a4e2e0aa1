"""The gallery folder: its builder (``build``), reader (``core``, ``read``), writers
(``write``, ``segments``), files, lock, the model it was built with, and its evaluation."""
