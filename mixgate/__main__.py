from mixgate.cli import main

raise SystemExit(main())
