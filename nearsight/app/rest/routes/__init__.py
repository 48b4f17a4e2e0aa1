"""The REST API's routes, one router per resource: health, items, search."""
