"""Moved to :mod:`kinference_common.detectors.core` (the router can run the
pattern classifiers in its own process, and services share only
kinference_common); this name stays the same module object."""

import sys

from kinference_common.detectors import core as _moved

sys.modules[__name__] = _moved
