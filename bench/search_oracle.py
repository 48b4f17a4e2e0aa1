"""The search oracle (tests/search/test_search_oracle.py) over many more generated catalogs than
`make test` runs: every route, every index type, filters of every operator, re-ranking off and
on, against a float64 brute force.

    python bench/search_oracle.py --examples 40

Each catalog builds five galleries of 300 items and serves them; count about 10 s a catalog on
this 2-core CPU. Exit status: pytest's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=40, help="generated catalogs (default 40)")
    args = parser.parse_args()
    env = {**os.environ, "NEARSIGHT_ORACLE_EXAMPLES": str(args.examples)}
    test = ROOT / "tests" / "search" / "test_search_oracle.py"
    return subprocess.call([sys.executable, "-m", "pytest", "-q", str(test)], cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main())
