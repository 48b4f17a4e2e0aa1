"""What every layer shares: the one error type, atomic file writes and progress bars.

The lowest layer of nearsight: it imports nothing from models, index, training or app.
"""
