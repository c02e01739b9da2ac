from kinfctl.main import main

raise SystemExit(main())
