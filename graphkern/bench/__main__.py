from graphkern.bench.cli import main

raise SystemExit(main())
