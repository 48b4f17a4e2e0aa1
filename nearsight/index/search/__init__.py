"""Finding neighbours: FAISS indexes and their tuning, filters on item metadata, filtered
search and the JSON answer shape."""
