"""Plain helpers shared by the test files: builders of small data, models and galleries, the
in-process CLI runner, the servers, assertions. No fixtures here (they live in conftest.py, and
call these); test files import what they need: ``from helpers import run, FAST``. Each topic is a
module of this package; every public name is here too."""

from __future__ import annotations

from helpers.bombs import exif_tag_bomb, jpeg_scan_bomb, tag_bomb, tiff_tag_bomb
from helpers.browser import CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS, upload
from helpers.cli import (
    CLASSES,
    FAST,
    PER_CLASS,
    SHOP_NAMES,
    SHOP_SINCE,
    SHOPS,
    TinyGallery,
    assert_one_line_error,
    cli_argv,
    make_product,
    make_shop,
    make_staged_gallery,
    make_tiny_gallery,
    random_stage_scorer,
    read_jsonl,
    run,
    tiny_model,
)
from helpers.galleries import (
    ONNX_CLASSES,
    ONNX_DIM,
    ONNX_PER_CLASS,
    ONNX_SIZE,
    OnnxGallery,
    make_onnx_gallery,
    write_digits,
)
from helpers.inspect_data import (
    clustered_vectors,
    flip_labels,
    import_vectors,
    plant_copies,
    top1_correct,
)
from helpers.losses import (
    assert_float32_agrees_with_float64,
    assert_no_python_loop_over_anchors,
    autograd,
    count_python_calls,
    random_batch,
)
from helpers.paths import ROOT
from helpers.photo_shop import (
    PHOTO_SHOP_DIM,
    PHOTO_SHOP_INDEX_TYPES,
    PHOTO_SHOP_ITEMS,
    make_photo_shop,
)
from helpers.processes import (
    build_wheel,
    disk_mb,
    free_port,
    process_mb,
    running_page,
    serve_process,
    server_settings,
    started,
    stop_process,
    torchrun,
)
from helpers.sockets import address_of, closed_within, connect_from, read_response
from helpers.threads import HeldModel
from helpers.timm import TIMM_CONVNEXT, TIMM_RESNET, TIMM_VIT, write_hub_weights
from helpers.training import (
    TINY_TRAIN,
    TrainingCrash,
    crash_training,
    train_one_and_two_processes,
)

__all__ = [
    "HeldModel",
    "make_staged_gallery",
    "random_stage_scorer",
    "disk_mb",
    "address_of",
    "closed_within",
    "connect_from",
    "read_response",
    "ROOT",
    "ONNX_CLASSES",
    "ONNX_PER_CLASS",
    "ONNX_SIZE",
    "ONNX_DIM",
    "OnnxGallery",
    "make_onnx_gallery",
    "write_digits",
    "free_port",
    "build_wheel",
    "running_page",
    "server_settings",
    "stop_process",
    "started",
    "torchrun",
    "serve_process",
    "process_mb",
    "TINY_TRAIN",
    "TrainingCrash",
    "train_one_and_two_processes",
    "crash_training",
    "FAST",
    "CLASSES",
    "PER_CLASS",
    "SHOPS",
    "tiny_model",
    "run",
    "cli_argv",
    "assert_one_line_error",
    "read_jsonl",
    "TinyGallery",
    "make_tiny_gallery",
    "make_product",
    "SHOP_NAMES",
    "SHOP_SINCE",
    "make_shop",
    "CHROMIUM",
    "CHROMIUM_ARGS",
    "TIMEOUT_MS",
    "upload",
    "random_batch",
    "autograd",
    "count_python_calls",
    "assert_no_python_loop_over_anchors",
    "assert_float32_agrees_with_float64",
    "TIMM_VIT",
    "TIMM_CONVNEXT",
    "TIMM_RESNET",
    "write_hub_weights",
    "exif_tag_bomb",
    "tiff_tag_bomb",
    "tag_bomb",
    "jpeg_scan_bomb",
    "clustered_vectors",
    "flip_labels",
    "import_vectors",
    "make_photo_shop",
    "PHOTO_SHOP_DIM",
    "PHOTO_SHOP_INDEX_TYPES",
    "PHOTO_SHOP_ITEMS",
    "plant_copies",
    "top1_correct",
]
