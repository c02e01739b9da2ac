"""kinfctl: the operator's command line (lint, get, explain, classify, events)."""
