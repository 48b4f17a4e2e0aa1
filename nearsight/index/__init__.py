"""Images in, vectors out: image loading, dataset readers, the gallery catalog, retrieval metrics."""
