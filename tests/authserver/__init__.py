"""An OAuth 2.1 authorization server for the test suite and a local demo, built on authlib.

Run it with ``python -m tests.authserver --port 0 --user alice:secret:admins``: its first line
on stdout is the URL it listens on (its issuer), its state lives in memory and ends with it.
``harness.py`` starts it as a process for a test and hands back a small handle; ``docs/testing.md``
says what it offers. It is never shipped: nothing under ``aggregator/`` may import it.
"""
