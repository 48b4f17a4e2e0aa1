"""What a person touches: the ``nearsight`` command line and the Gradio page."""

import os

# Before any app module imports gradio: no telemetry, no version check.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
