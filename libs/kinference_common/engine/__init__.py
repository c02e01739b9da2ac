"""The decision engine: a pure function of (compiled pool, snapshot, request).

Pieces, one concern each (flat modules):

- :mod:`.request`: :class:`Request` (the request as a policy sees it),
  request tests, :func:`required_classifiers`;
- :mod:`.tokens`: the prompt-token estimator and prompt block hashes;
- :mod:`.candidates`: candidates built from telemetry;
- :mod:`.ttft`: the PredictedTTFT model;
- :mod:`.ledger`: the router's in-flight ledger;
- :mod:`.prefix`: the approximate prefix index;
- :mod:`.signals`: signals and candidate tests (filters);
- :mod:`.snapshot`: the per-snapshot precomputation;
- :mod:`.decide`: the decision (rules, exclusions, tiers, tie-breakers);
- :mod:`.trace`: the explain trace.

Typical use by the router::

    snap = Snapshot(pool, endpoints, providers, now=time.time(), ejected=ejected)
    needed = snap.classifiers_for(request)          # ask these, then set tags
    d = decide(snap, request, ledger=ledger, prefix=prefix_index, rng=rng)
    if d.routed:
        send = ledger.sent(d.candidate.ledger_key, d.prefill_tokens, time.time())
        # ... ledger.first_token(send, now) on the first token, ledger.finished(send, now) at the end;
        # ledger.observed(key, state.scraped_at) whenever telemetry for key arrives
        prefix_index.record(d.candidate.ledger_key, request.block_hashes)
"""

from .decide import Decision, decide, interpret, rejection_status
from .ledger import InFlightLedger
from .prefix import PrefixIndex
from .request import Request, required_classifiers
from .snapshot import Snapshot
from .tokens import block_hashes, estimate_tokens, prompt_block_hashes
from .trace import DecisionTrace, build_trace, encode_trace
from .ttft import Calibration, TTFTModel

__all__ = [
    "Calibration",
    "Decision",
    "DecisionTrace",
    "InFlightLedger",
    "PrefixIndex",
    "Request",
    "Snapshot",
    "TTFTModel",
    "block_hashes",
    "build_trace",
    "decide",
    "encode_trace",
    "estimate_tokens",
    "interpret",
    "prompt_block_hashes",
    "rejection_status",
    "required_classifiers",
]
