"""``nearsight reproduce``: a recipe trained, exported, indexed and evaluated (run.py), and its
report beside the paper's row (table.py)."""
