from aggregator.cli import main

raise SystemExit(main())
