"""The embedding network, checkpoint I/O, ONNX export and the Embedder runtimes.

The lowest layer of nearsight: it imports nothing from index, training or app.
"""
