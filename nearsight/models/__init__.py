"""The embedding network, checkpoint I/O, ONNX export and the Embedder runtimes.

It imports only nearsight.core: nothing from index, training or app.
"""
