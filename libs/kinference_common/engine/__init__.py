"""The decision engine: a pure function of (compiled pool, snapshot, request)."""
