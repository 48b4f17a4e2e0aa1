"""The stage store widens its float16 rows through a one-node onnxruntime graph kept as bytes
(the serving install has no onnx package): the bytes are that graph, and it gives astype's
values for every float16 bit pattern."""

from __future__ import annotations

import numpy as np

from nearsight.search.rerank.stage_store import HALF_WIDENER_ONNX, widen_halves


def test_the_stored_bytes_are_the_cast_graph_onnx_builds():
    from onnx import TensorProto, helper

    node = helper.make_node("Cast", ["halves"], ["floats"], to=TensorProto.FLOAT)
    graph = helper.make_graph(
        [node],
        "widen",
        [helper.make_tensor_value_info("halves", TensorProto.FLOAT16, ["N", "F"])],
        [helper.make_tensor_value_info("floats", TensorProto.FLOAT, ["N", "F"])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8, producer_name="nearsight"
    )
    assert model.SerializeToString() == HALF_WIDENER_ONNX


def test_every_half_widens_to_the_value_astype_gives():
    halves = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).reshape(64, 1024)
    got = widen_halves(halves)
    expected = halves.astype(np.float32)
    assert got.dtype == np.float32 and got.shape == expected.shape
    # bit for bit, NaN payloads aside (every NaN stays NaN, and only NaNs are)
    nan = np.isnan(expected)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), expected[~nan].view(np.uint32))


def test_empty_and_one_dimensional_rows_widen_too():
    assert widen_halves(np.zeros((0, 8), np.float16)).shape == (0, 8)
    np.testing.assert_array_equal(widen_halves(np.ones(3, np.float16)), np.ones(3, np.float32))
