"""What the serving benches (fair_shares.py, floods.py) share: a small random gallery and
`nearsight serve` over it in a process of its own. Not a bench itself."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import numpy as np


def random_gallery(root: Path, items: int, shops: int = 0) -> Path:
    """A 32-px ResNet-18 (8-d, random) exported to ONNX and a flat gallery of ``items`` random
    unit vectors (`nearsight index import`), each in one of ``shops`` shops (a ``shop`` column;
    none with 0); the gallery's folder."""
    import torch

    from nearsight.app.cli import main
    from nearsight.models.checkpoint import save_checkpoint
    from nearsight.models.embedding import EmbeddingConfig, build_embedding_net
    from nearsight.models.export import export_onnx

    torch.manual_seed(0)
    config = EmbeddingConfig(dim=8, image_size=32, arch="resnet18")
    save_checkpoint(root / "model.pt", build_embedding_net(config))
    export_onnx(root / "model.pt", root / "model.onnx")
    vectors = np.random.default_rng(0).normal(size=(items, 8)).astype(np.float32)
    np.save(root / "v.npy", vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
    if shops:
        rows = "".join(f"/x/{i}.jpg,s{i % shops}\n" for i in range(items))
        (root / "m.csv").write_text("path,shop\n" + rows)
    else:
        (root / "m.csv").write_text("path\n" + "".join(f"/x/{i}.jpg\n" for i in range(items)))
    code = main(["index", "import", "--vectors", str(root / "v.npy"), "--meta",
                 str(root / "m.csv"), "--model", str(root / "model.onnx"), "--out",
                 str(root / "g"), "--index-type", "flat"])  # fmt: skip
    assert code == 0
    return root / "g"


@contextlib.contextmanager
def served(gallery: Path, options: Sequence[str] = ()) -> Iterator[str]:
    """`nearsight serve` over ``gallery`` on a free port with ``options`` (no access log, no
    analysis); its URL once /api/health answers. Stopped on leaving."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "nearsight.app.cli", "serve", "--gallery", str(gallery),
               "--port", str(port), "--no-access-log", "--analysis-max-items", "0", *options]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/api/health", timeout=1).status_code == 200:
                    break
            time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(30)
