"""Operating the proxy: the admin paths and what they report.

Owns the admin listener and paths (``admin``), health, readiness and the status snapshot
(``status``), its page (``status_page``), and a profile's catalog as people read it
(``catalog_view``, which ``aggregator tools`` prints too). The instruments they read are
below, in ``telemetry``.

Floor 8 (tests/core/test_layering.py). May import ``fronts`` (``admin`` takes the
admission path and boundary every front shares), ``hub`` (``admin``, ``status`` read the
``Hub``), and every floor below; never ``cli``. The HTTP front serves the read-only
admin paths on its own port too: ``cli.serve`` hands them to it (``AdminPaths``).
"""
