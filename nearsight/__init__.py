"""nearsight: image retrieval built on deep metric learning.

The repository's folders are this package's sub-packages: ``nearsight.models`` (the embedding
network, export, embedders), ``nearsight.index`` (images, datasets, galleries, metrics),
``nearsight.training`` (losses, samplers, trainer) and ``nearsight.app`` (CLI and page).
"""

__version__ = "0.1.0"
