from sluice.cli.main import main

raise SystemExit(main())
