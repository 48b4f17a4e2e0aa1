"""Batch samplers: the (m,n)-group design, the p-random pair design and m-per-class batches."""
