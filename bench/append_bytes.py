"""Bytes written by adding one item to a large gallery (appends write the item, not the gallery).

    python bench/append_bytes.py [--items 1000000] [--dim 128] [--workdir DIR]

Builds a flat gallery of --items random unit vectors, then a child process opens it and adds one
vector; the child reports /proc/self/io's wchar (bytes passed to write calls) and write_bytes
(bytes sent to the block layer) across the add alone. Linux only. A script, not a test.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from nearsight.index.gallery.write import write_gallery

CHILD = """
import sys
import numpy as np
from nearsight.index.gallery.core import Gallery

def io() -> dict:
    with open("/proc/self/io") as handle:
        return {k: int(v) for k, v in (line.split(": ") for line in handle.read().splitlines())}

vector = np.ones((1, int(sys.argv[2])), np.float32) / np.sqrt(int(sys.argv[2]))
with Gallery.open(sys.argv[1]) as gallery:
    before = io()
    gallery.add(vector, [{"path": "/new.jpg"}])
    after = io()
print(after["wchar"] - before["wchar"], after["write_bytes"] - before["write_bytes"])
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument(
        "--workdir", type=Path, help="where the gallery is written (made if missing)"
    )
    args = parser.parse_args(argv)
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.workdir) as work:
        rng = np.random.default_rng(0)
        vectors = rng.standard_normal((args.items, args.dim), dtype=np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        items = [{"path": f"/bench/{i}.jpg"} for i in range(args.items)]
        folder = write_gallery(Path(work) / "g", vectors, items, model_sha256="", index_type="flat")
        del vectors, items
        size = sum(p.stat().st_size for p in folder.iterdir())
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(folder), str(args.dim)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        wchar, write_bytes = map(int, done.stdout.split())
    print(
        f"add of 1 item to a {args.items}-item, {args.dim}-d gallery ({size} bytes on disk): "
        f"wchar {wchar} bytes, write_bytes {write_bytes} bytes"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
