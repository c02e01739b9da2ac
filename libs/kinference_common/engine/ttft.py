"""PredictedTTFT: how long *this* request would wait for its first token on
*this* endpoint (POLICY.md section 5).

The model (TELEMETRY.md, "Predicting TTFT", the explainable per-endpoint form)
---------------------------------------------------------------------------
::

    PredictedTTFT = c * ( T0 + W / Theta * (1 + k*R) + KVwait )

    W      = Q + U                        prefill tokens ahead of, and of, this request
    Q      = (queued_others * q_mean)     engine-queued requests this router did not send
             + own_pending_tokens         this router's sends without a first token yet
    U      = uncached prompt tokens       P - tokens the prefix index says are cached
                                          (or P * (1 - h) with h the endpoint's hit rate,
                                          when the request has no block hashes)
    Theta  = prefill tokens per second    learned online by the collector; the
                                          largest of the worker set's endpoints
                                          with the same KV capacity (the same
                                          GPUs: candidates.peer_thetas)
    R      = running requests             each takes a slot of every step's token budget
    KVwait = max(0, W - free KV tokens) / Theta
                                          not enough KV room: blocks must be freed first,
                                          at about the rate they are filled
    T0     = fixed per-request overhead   learned by the collector
    c      = calibration                  observed / predicted, 1.0 until learned

``queued_others = max(0, engine_waiting - own sends the engine already
reports)``, so this router's own sends are counted once, with their real
prompt sizes, whether or not the last scrape saw them.

Unknowns get defaults, never "unknown": ``Theta`` falls back to the median of
the worker set's known endpoints, then to :attr:`TTFTModel.default_prefill_tps`;
``T0`` likewise to the worker set's, then the pool's median, then
:attr:`TTFTModel.default_overhead_seconds`; ``R`` to 0; an unknown
prompt size to :attr:`TTFTModel.default_prompt_tokens`. A stale endpoint's
engine signals are unknown: ``Q`` is the router's own pending tokens only.

Linear in the request's uncached tokens: with ``A = T0 + Q*B`` and
``B = (1 + k*R) / Theta`` (both per endpoint, precomputed per snapshot except
for the ledger part), ranking 1,000 endpoints is one multiply-add each.
"""

from __future__ import annotations

import math

from msgspec import Struct


class TTFTModel(Struct, frozen=True, kw_only=True):
    """Constants of the PredictedTTFT model; defaults for unknown telemetry."""

    #: prefill throughput when neither the endpoint nor its worker set has one
    default_prefill_tps: float = 4000.0
    #: fixed overhead when unknown (HTTP, tokenisation, scheduling), seconds
    default_overhead_seconds: float = 0.03
    #: prompt tokens assumed for each engine-queued request of another router
    queued_prompt_tokens: float = 512.0
    #: slowdown per running request: each running decode takes one token of
    #: every step's budget (``max_num_batched_tokens``: 2048 on smaller GPUs,
    #: 8192 on H100-class), so prefill gets ``B - R`` of ``B``: ~``1 + R/B``.
    #: 1/2048 measured best of 1/256, 1/2048, 1/8192 against the simulator
    #: (``python -m tests.engine.ttft_accuracy``)
    running_slowdown: float = 1.0 / 2048.0
    #: prompt size assumed when the request has no estimate
    default_prompt_tokens: int = 256
    #: observed / predicted TTFT, learned online by whoever owns the model
    calibration: float = 1.0
    #: ``minimize: PredictedTTFT`` ranks as equal the candidates predicted
    #: within ``tie_tolerance`` (relative) or ``tie_tolerance_seconds`` of the
    #: best, and lets the rule's ``tieBreak`` choose among them: the model
    #: is not accurate to a few percent (each endpoint's Theta and T0 are
    #: learned from its own noisy samples), and treating such differences
    #: as real sends every request without a prefix match to the one idle
    #: endpoint whose learned Theta happens to be highest. That piles
    #: prefixes onto a few endpoints until their KV caches evict them (the
    #: fleet benchmark's tail; docs/routing-benchmark.md). Without a
    #: ``tieBreak`` the lowest prediction still wins.
    tie_tolerance: float = 0.1
    tie_tolerance_seconds: float = 0.005
    #: in a tier ranked by PredictedTTFT with ``tieBreak``, each candidate
    #: is also charged this many times the prefill it would do beyond the
    #: best prefix holder's (``PT * (u - u_min)``): the cost to the fleet of
    #: a second copy of a prefix (a full prefill now, KV space another prefix
    #: loses), which the request's own TTFT does not show. 0 ranks by the
    #: request's TTFT alone.
    prefix_stickiness: float = 3.0
    #: ... and this many times when the candidate's KV cache is nearly full
    #: (``kvCacheUsage`` at ``full_kv`` and above; linear from
    #: ``prefix_stickiness`` at ``busy_kv``). A second copy of a prefix on a
    #: pod whose KV blocks are all taken by running requests evicts another
    #: prefix (someone else's full prefill later) and takes the blocks its
    #: running requests need to grow (preemption: their prefill again), so a
    #: yield there costs the fleet several prefills, not one. Measured in
    #: the fleet benchmark (docs/routing-benchmark.md, "trial": 4 pods of
    #: 1,200 KV blocks at full load).
    prefix_stickiness_full_kv: float = 12.0
    busy_kv: float = 0.5
    full_kv: float = 0.9
    #: ... and this many times on a candidate with *nothing waiting*: its
    #: last scrape shows no request waiting (and KV use at most
    #: ``busy_kv``), and no send of this router or its peers there is still
    #: before its first token. A copy there delays nobody's first token
    #: (the pod's step budget has room for its prefill beside the running
    #: decodes) and its blocks are free, so it evicts nothing in use
    #: (unless the prompts sent to it lately fill its cache: the hot
    #: fraction raises the charge as on any pod). Charged as a pod with a
    #: queue, a pod that held no prefix once every prefix had a holder (a
    #: cold start, a pod added by a scale-up) stayed idle while the holders
    #: queued (``multiturn`` at 0.9 load left one of eight pods idle for
    #: 21 s), and a conversation or a group stayed on a holder in the middle
    #: of a long prefill step while pods with room decoded (``multiturn``,
    #: ``hetero``): docs/routing-benchmark.md, fixes 8 and 12. 0.5 measured
    #: against 0, 0.1, 0.25 and 1: lower gave ``shared_prefix_long`` at full
    #: load copies of its 6,000-token prefixes that the fleet's cache could
    #: not keep.
    prefix_stickiness_unqueued: float = 0.5
    #: False: that charge only on an *idle* candidate (nothing running
    #: either, nothing of this router's or its peers' in flight), as routers
    #: did before fix 12 (decision records before schema version 4, which
    #: ``kinfctl replay`` takes that way, at their 1x)
    unqueued_running: bool = True
    #: spread: in the same tiers, a request the ranking and the tie-breakers
    #: give to a busy prefix holder goes instead to the least-loaded
    #: candidate when that one carries at most ``spread_fraction`` of the
    #: candidates' mean load (requests running and waiting at the scrape, or
    #: open from the routers when more; a pod whose scrape lacks the counts
    #: is left out), holds at most ``spread_held_fraction`` of their mean
    #: prompt blocks in the prefix index (a pod added by a scale-up,
    #: restarted with an empty cache: not a pod of a steady fleet between
    #: two bursts), the holder carries at least the mean and
    #: ``spread_min_load``, and the move costs this request no more than
    #: the copy would cost on the holder (the taker's PredictedTTFT counts
    #: the copies already on their way there, which bounds how many it takes
    #: before their first tokens; a slower pod takes one only when the
    #: holder's queue outweighs the difference). Without it a pod that joined once every
    #: prefix had a warm holder never got a request: chunked prefill keeps
    #: the holders' first tokens quick however many requests they decode, so
    #: no prediction favoured the cold pod (docs/routing-benchmark.md, "A
    #: pod added under load"). 0 turns the spread off.
    spread_fraction: float = 0.25
    spread_held_fraction: float = 0.5
    spread_min_load: int = 32
    #: relief: in the same tiers, the stickiness charge is multiplied by
    #: ``stickiness_relief`` when the best prefix holder is overloaded for
    #: lasting reasons, not for a moment: its scrape carries at least
    #: ``relief_load`` times its peers' mean load (requests running and
    #: waiting; pods whose scrape lacks the counts left out) *and* the
    #: prefixes sent to it in the last seconds take at least ``relief_hot``
    #: times its peers' mean part of a cache
    #: (:meth:`.prefix.PrefixIndex.hot_fraction`: it holds more than its
    #: share of the prefixes in use). Its peers are the candidates of its
    #: KV capacity (as for ``peer_prefill_rate``): against the slower pods
    #: of another GPU type, which take few requests by design, every fast
    #: pod would look overloaded (``hetero``). The groups and conversations a pod
    #: took when their first request came stay there (a warm holder always
    #: predicts faster than a cold pod); where those first placements came
    #: out uneven, the relief lets a loaded holder's requests start a second
    #: copy on a pod with room, and the prefix's later requests share the
    #: two. Both conditions: on load alone, the copies made while every
    #: pod was still prefilling its first prompts added work at full load
    #: (``trial`` seed 3: p99 0.118 -> 0.264 s); on prefixes alone, a pod
    #: with a larger share of prefixes and no queue gave up its requests
    #: for nothing. docs/routing-benchmark.md, fix 16. 1 turns it off.
    stickiness_relief: float = 0.5
    relief_load: float = 1.25
    relief_hot: float = 1.1
    #: continuation: in the same tiers, where the best holders' match ends
    #: at the last full block of a prompt sent to one of them
    #: (:meth:`.prefix.PrefixIndex.continued_on`: a conversation's next turn;
    #: a prefix shared by several prompts ends inside them), the
    #: stickiness charge is multiplied by ``continuation_stickiness``, and
    #: on a candidate with nothing waiting (the ``prefix_stickiness_unqueued``
    #: charge) by ``continuation_unqueued`` too. Moving such a turn leaves no
    #: second copy in use: the holder's copy is the conversation's past,
    #: which ages out, where a group's prefix stays in use on both pods.
    #: Without it a turn stayed on its conversation's pod while several
    #: arrived there at once, and the first of them waited for the others'
    #: prefills in the same engine step (``multiturn``'s slowest 1%).
    #: Measured over five draws of the scrape instants, seeds 1-3:
    #: docs/routing-benchmark.md, fix 17. 1 and 1 turn it off.
    continuation_stickiness: float = 0.5
    continuation_unqueued: float = 0.0
    #: an endpoint's Theta is the largest learned by its worker set's
    #: endpoints with the same KV capacity (the same engine on the same
    #: GPUs: :func:`.candidates.peer_thetas`); False: each its own
    peer_prefill_rate: bool = True

    def stickiness(self, kv: float | None) -> float:
        """The prefix stickiness charged to a candidate with this KV use."""
        s = self.prefix_stickiness
        if kv is None or kv <= self.busy_kv or self.prefix_stickiness_full_kv <= s:
            return s
        f = 1.0 if kv >= self.full_kv else (kv - self.busy_kv) / (self.full_kv - self.busy_kv)
        return s + (self.prefix_stickiness_full_kv - s) * f


DEFAULT_TTFT_MODEL = TTFTModel()


class Calibration:
    """``c`` learned online (TELEMETRY.md: "an online calibration factor from
    observed/predicted TTFT"), by the router that sees both numbers.

    Each sample is a streamed local request's observed TTFT (send to first
    chunk; a non-streamed answer's first byte comes after its last token) over
    the model's prediction for it *without* calibration, taken when the
    request was decided. ``c`` is a moving average of those ratios on the log
    scale (a request 3x slower than predicted weighs as much as one 3x
    faster), each ratio clamped to [1/10, 10] so one stalled request cannot
    swing it; ``c`` itself stays within [1/4, 4] (the model's structure is
    trusted that far) and is 1.0 until ``min_samples`` arrived. One factor
    per pool, as the model has one: it corrects what all endpoints share
    (HTTP and tokenisation overhead, a prefill rate learned on another
    workload); per-endpoint differences are the model's own signals.
    """

    def __init__(self, *, alpha: float = 0.05, min_samples: int = 20, bound: float = 4.0) -> None:
        self.alpha = alpha
        self.min_samples = min_samples
        self.bound = bound
        self.samples = 0
        self._log_c = 0.0

    def observe(self, observed_seconds: float, predicted_uncalibrated: float) -> None:
        if not (observed_seconds > 0 and predicted_uncalibrated > 0) or math.isinf(predicted_uncalibrated):
            return
        ratio = min(10.0, max(0.1, observed_seconds / predicted_uncalibrated))
        sample = math.log(ratio)
        # the first samples average evenly, then the moving average takes over
        weight = max(self.alpha, 1.0 / (self.samples + 1))
        self._log_c += weight * (sample - self._log_c)
        self.samples += 1

    @property
    def value(self) -> float:
        if self.samples < self.min_samples:
            return 1.0
        limit = math.log(self.bound)
        return math.exp(min(limit, max(-limit, self._log_c)))


def uncached_tokens(
    prompt_tokens: int, matched_blocks: int, total_blocks: int, hit_rate: float | None
) -> float:
    """Prompt tokens the endpoint must prefill (see the module docstring)."""
    if total_blocks:
        if matched_blocks <= 0:
            return float(prompt_tokens)
        return prompt_tokens * (1.0 - min(matched_blocks, total_blocks) / total_blocks)
    if hit_rate:
        return prompt_tokens * (1.0 - min(max(hit_rate, 0.0), 1.0))
    return float(prompt_tokens)
