"""The gallery folder: its reader (``core``), writers (``write``, ``segments``), files, lock,
the model it was built with, and its evaluation."""
