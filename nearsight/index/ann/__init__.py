"""The FAISS side of a gallery: index types and their parameters (``faiss_index``), the choice by
size and memory (``index_choice``), nprobe / efSearch tuning (``tuning``) and the search
restricted to a set of ids (``filtered``)."""
