"""The Gradio page of ``nearsight serve``: its layout (layout.py), event handlers, HTML and
tables, the Map tab, and one gallery as the page sees it (view.py)."""
