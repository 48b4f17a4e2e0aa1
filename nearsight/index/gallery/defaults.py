"""The gallery builder's defaults, in a module that imports nothing (the command line reads them
for its flags without loading numpy or FAISS)."""

DEFAULT_CHUNK_SIZE = 4096  # images per resumable chunk (and per torchrun shard's turn)
DEFAULT_BATCH_SIZE = 64  # images per embedding batch
MAX_LISTED_ERRORS = 20  # unreadable images listed one per line; past this, a count
