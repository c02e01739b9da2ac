"""The benchmarks live in the repository's ``bench/`` (not an installed package)."""

import sys
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[2])
if REPO not in sys.path:
    sys.path.insert(0, REPO)
