"""How many threads one process should use: its share of the machine's physical cores.

Several processes on one machine (``torchrun --nproc_per_node N`` sets ``LOCAL_WORLD_SIZE``;
DataLoader workers; a user's own ``OMP_NUM_THREADS``) must split the cores, or N processes
each run a thread per core and spend their time waiting for each other. onnxruntime, torch and
FAISS all take :func:`worker_threads`.
"""

from __future__ import annotations

import os
from pathlib import Path


def physical_cores() -> int:
    """Physical cores this process may run on (hyper-threads counted once)."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
    cores = set()
    for cpu in allowed:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            package = (topology / "physical_package_id").read_text().strip()
            core = (topology / "core_id").read_text().strip()
        except OSError:
            return max(1, len(allowed))
        cores.add((package, core))
    return max(1, len(cores))


def worker_threads(requested: int | None = None) -> int:
    """Threads for this process: ``requested`` when given; else ``OMP_NUM_THREADS`` when set
    (torchrun sets it to 1 for several processes, and users set it on purpose); else the
    physical cores divided among ``LOCAL_WORLD_SIZE`` processes on this machine."""
    if requested is not None:
        return max(1, int(requested))
    omp = os.environ.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) > 0:
        return int(omp)
    local = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
    processes = int(local) if local.isdigit() and int(local) > 0 else 1
    return max(1, physical_cores() // processes)
