"""Images in: decoding (``images``, ``jpeg``), dataset readers and archives (``datasets``), the
typing of item metadata (``meta``), and the retrieval metrics (``metrics``). Below the gallery
store (nearsight.index) and training; imports only nearsight.core."""
