"""`python -m aggregator`: the same command line as `aggregator`."""

from aggregator.cli import main

raise SystemExit(main())
