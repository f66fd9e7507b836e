"""Settings for the whole test suite.

Hypothesis profiles, chosen with the ``HYPOTHESIS_PROFILE`` environment variable:
``ci`` (the default) runs each property and fuzz test with 100 examples, so the suite stays
within its time budget; ``thorough`` runs 3,000 each, for a search before a release or
after a change to the codec, the router or a front. Neither has a deadline: a slow example
on a loaded machine is not a failure. A test that needs a fixed count says so with
``@settings(max_examples=...)``, which no profile changes.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", max_examples=100, deadline=None, print_blob=True)
settings.register_profile("thorough", max_examples=3000, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
