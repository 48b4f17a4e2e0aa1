"""The papers' evaluation: Recall@k and MAP@R by exact search (``retrieval``), NMI by k-means
(``nmi``), and the checks both make of their input (``inputs``)."""
