"""The fake server (``tests/fakesrv.py``), except that while the file named by its first
argument exists it says so on stderr and exits at once (status 5): a test holds it down
and lets it come back."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.fakesrv import main  # noqa: E402 - after the path that finds it

if __name__ == "__main__":
    if os.path.exists(sys.argv[1]):
        print(f"held down: {sys.argv[1]} exists", file=sys.stderr, flush=True)
        raise SystemExit(5)
    raise SystemExit(main(sys.argv[2:]))
