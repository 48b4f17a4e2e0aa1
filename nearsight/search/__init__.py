"""Searching a gallery: the one search route (query -> candidates -> filters -> re-ranking ->
typed neighbours), re-ranking (``rerank``), results, evaluation and the failure analysis.
A sibling of nearsight.training: neither imports the other."""
