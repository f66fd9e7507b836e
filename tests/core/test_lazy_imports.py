"""A proxy without ``[auth]`` or per-user credentials does not load what only they need.

The token verifier (joserfc, cryptography) and the HTTP client (httpx) cost about 15 MB
of resident memory at start-up, which every proxy would pay for a feature few configure:
they are imported where an ``[auth]`` table or a network server needs them.
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
HEAVY = ("joserfc", "cryptography", "httpx")


def test_starting_the_proxy_loads_no_token_or_http_library():
    probe = (
        "import sys, aggregator.cli.serve, aggregator.hub.hub, aggregator.fronts.access; "
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"imported at start-up: {out.stdout.strip()}"
