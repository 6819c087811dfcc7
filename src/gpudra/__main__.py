from gpudra.cli import main

raise SystemExit(main())
