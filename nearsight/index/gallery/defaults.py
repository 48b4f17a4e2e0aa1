"""The gallery builder's defaults, in a module that imports nothing else (the command line reads
them for its flags without loading numpy or FAISS)."""

import os

DEFAULT_CHUNK_SIZE = 4096  # images per resumable chunk (and per torchrun shard's turn)
DEFAULT_BATCH_SIZE = 64  # images per embedding batch
MAX_LISTED_ERRORS = 20  # unreadable images listed one per line; past this, a count
DEFAULT_WORKERS = min(4, os.cpu_count() or 1)  # image-decoding threads of `index add`
