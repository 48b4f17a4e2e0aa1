"""The gallery store: a folder of a SQLite catalog (``catalog``) and a FAISS index (``ann``)
that always agree (``gallery``), the one gallery builder, add / remove / compact, keys, and the
chunks that sharded builds and ``index import`` read. Searching it is nearsight.search."""
