"""What a person touches: the ``nearsight`` command line and the Gradio page."""
