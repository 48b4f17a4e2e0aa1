"""Failure inspection over a gallery's stored embeddings, as pandas DataFrames: the
leave-one-out failures and a self-contained HTML report of them, two models compared on the
same items, suspected wrong labels, duplicate images, and where in two images their
similarity comes from. ``nearsight inspect`` is a thin layer over these functions."""
