"""Settings for the whole test suite.

Hypothesis profiles: ``fast`` (the default) keeps the suite within its time budget;
``HYPOTHESIS_PROFILE=long`` runs every property and fuzz test that does not fix its own
count with many more examples. Tests that need a fixed count say so with ``@settings``.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("fast", max_examples=100)  # hypothesis's own default
settings.register_profile("long", max_examples=3000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))
