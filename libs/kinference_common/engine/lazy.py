"""Lazy classification: ask a classifier only when its answer can change the
decision, and decide exactly as if every tag were known.

A request *requires* the classifiers of the rules whose non-tag terms hold
for it (:meth:`.snapshot.Snapshot.classifiers_for`). Many such requests are
decided the same way whatever those classifiers say: the pick is Local and
the tag-conditioned exclusion only drops Providers, or every candidate is
gone anyway. :func:`decide_lazily` finds that out without waiting for any
classifier, by deciding once per *tag class* of each classifier whose tags
are not known yet and comparing the outcomes:

- A classifier emits exactly one of its tags (failure tag included, POLICY.md
  section 6). A policy reads tags only through "the request carries any of
  these tags" (``matches`` entries and exclusions' ``if``), so two tags of a
  classifier that every tag list of the policy contains both or neither of
  lead to the same decision, step for step. :func:`tag_classes` groups a
  classifier's tags so, per snapshot; one representative per class is
  decided (the failure tag represents its own class). The burst-unless-PII
  policy has two classes for ``pii``: ``{pii-confirmed, pii-unknown}`` and
  ``{pii-none}``: two decisions instead of one.
- When every combination of representatives gives the same outcome (routed
  or not, the same candidate, rule, code and reason), that outcome is the
  one the request would get with its real tags, since the real tags are one
  of the combinations: no classifier is asked. Otherwise the classifiers
  whose tag changes the outcome with the others held fixed are returned in
  ``needed``; the others cannot change it (for every combination) and are
  ``skipped``.

Exactness beyond the outcome: each trial decides with a copy of the
random source (``tieBreak: Random``), so every trial draws what the eager
decision would have drawn; when the policy uses ``Random``, the source's
state after the trial is part of the outcome compared, and the source is
advanced to it, so later decisions draw as in the eager path too. Trials
read the ledger and prefix index but never write them (``decide`` is pure):
the caller records the send (``InFlightLedger.sent``, ``PrefixIndex.record``)
once, for the decision it acts on, so PredictedTTFT never counts a request
twice.

The decision returned for an outcome that needed no classifier is the trial
in which every skipped classifier emitted its failure tag (the fail-closed
path, so its trace shows the exclusions that would apply on a failure);
its ``request`` carries only the tags actually known. ``skipped`` says, per
classifier, why it was not asked; :func:`skipped_traces` renders that for
the explain trace.
"""

from __future__ import annotations

import itertools
import random
import time
import weakref
from collections.abc import Callable, Sequence

import msgspec

from kinference_common.classifiers import BUILTIN_CLASSIFIERS

from .decide import Decision, decide
from .ledger import InFlightLedger
from .prefix import PrefixIndex
from .request import Request
from .snapshot import Snapshot

#: outcome key -> what "the same decision" means to the router
OutcomeKey = tuple


class LazyDecision:
    """What :func:`decide_lazily` found.

    ``decision`` is set when the outcome does not depend on any tag still
    unknown; otherwise it is None and ``needed`` lists the classifiers to ask
    (then call :func:`decide_lazily` again with their tags)."""

    __slots__ = ("decision", "needed", "skipped", "trials")

    def __init__(self) -> None:
        self.decision: Decision | None = None
        self.needed: list[str] = []
        #: classifier -> why it was not asked
        self.skipped: dict[str, str] = {}
        #: decisions taken to find out (1 when nothing was unknown)
        self.trials = 0


_classes_memo: weakref.WeakKeyDictionary[Snapshot, dict[str, list[list[str]]]] = weakref.WeakKeyDictionary()
_random_memo: weakref.WeakKeyDictionary[Snapshot, bool] = weakref.WeakKeyDictionary()


def _tag_lists(snapshot: Snapshot) -> list[frozenset[str]]:
    out: list[frozenset[str]] = []
    for rule in snapshot.pool.policy.rules:
        tests = list(rule.matches or []) + [e.when for e in rule.exclude if e.when is not None]
        out.extend(frozenset(t.tags) for t in tests if t.tags is not None)
    return out


def tag_classes(snapshot: Snapshot, classifier: str) -> list[list[str]]:
    """``classifier``'s tags grouped by how the snapshot's policy reads them:
    tags in the same group are in exactly the same tag lists, so they lead
    to the same decision. Each group's first tag is its representative (the
    failure tag leads its group). Memoised per snapshot."""
    memo = _classes_memo.get(snapshot)
    if memo is None:
        memo = {}
        _classes_memo[snapshot] = memo
    got = memo.get(classifier)
    if got is not None:
        return got
    info = BUILTIN_CLASSIFIERS[classifier]
    lists = _tag_lists(snapshot)
    groups: dict[tuple[bool, ...], list[str]] = {}
    ordered = [info.failure_tag] + [t for t in info.tags if t != info.failure_tag]
    for tag in ordered:
        groups.setdefault(tuple(tag in s for s in lists), []).append(tag)
    got = list(groups.values())
    memo[classifier] = got
    return got


def _uses_random(snapshot: Snapshot) -> bool:
    got = _random_memo.get(snapshot)
    if got is None:
        rules = list(snapshot.rules) + ([snapshot.unmatched] if snapshot.unmatched is not None else [])
        got = any("Random" in r.tie_break for r in rules)
        _random_memo[snapshot] = got
    return got


def outcome_key(d: Decision) -> OutcomeKey:
    """What the router acts on: routed or not, where (the candidate, hence
    the model sent upstream and the prefill work recorded), the rule, the
    code and reason of a rejection."""
    return (d.routed, d.candidate.index if d.candidate is not None else None, d.rule, d.code, d.reason)


def _why_skipped(name: str, classes: list[list[str]], d: Decision) -> str:
    emitted = ", ".join(t for group in classes for t in group)
    where = f"routed to {d.candidate.id}" if d.routed and d.candidate is not None else f"rejected ({d.code})"
    if len(classes) == 1:
        return f"no rule that applies reads its tags ({emitted}): {where} whatever it says"
    return f"every tag it can emit ({emitted}) gives the same outcome: {where}"


def decide_lazily(
    snapshot: Snapshot,
    request: Request,
    classifiers: Sequence[str],
    *,
    known: frozenset[str] | set[str] = frozenset(),
    ledger: InFlightLedger | None = None,
    prefix: PrefixIndex | None = None,
    rng: random.Random | None = None,
    avoid: frozenset[str] | set[str] = frozenset(),
    timer: Callable[[], float] = time.perf_counter,
) -> LazyDecision:
    """Decide ``request`` without the tags of the required ``classifiers``
    that are not in ``known`` (names of classifiers whose tags are already in
    ``request.tags``), when their tags cannot change the outcome.

    Pure like :func:`.decide.decide`; ``rng`` is advanced exactly as the
    eager decision would advance it (see the module docstring)."""
    start = timer()
    out = LazyDecision()
    pending = [c for c in classifiers if c not in known and c in BUILTIN_CLASSIFIERS]
    rng = rng if rng is not None else snapshot.rng
    if not pending:
        out.decision = decide(snapshot, request, ledger=ledger, prefix=prefix, rng=rng, avoid=avoid, timer=timer)
        out.trials = 1
        return out
    classes = {c: tag_classes(snapshot, c) for c in pending}
    reps = [[group[0] for group in classes[c]] for c in pending]
    with_random = _uses_random(snapshot)
    state = rng.getstate() if with_random else None
    results: dict[tuple[str, ...], tuple[OutcomeKey, Decision, object]] = {}
    base = request.tags
    for combo in itertools.product(*reps):
        trial_rng = rng
        if with_random:
            trial_rng = random.Random()
            trial_rng.setstate(state)  # type: ignore[arg-type]
        r = msgspec.structs.replace(request, tags=base | frozenset(combo))
        d = decide(snapshot, r, ledger=ledger, prefix=prefix, rng=trial_rng, avoid=avoid, timer=timer)
        after = trial_rng.getstate() if with_random else None
        results[combo] = (outcome_key(d) + ((after,) if with_random else ()), d, after)
        out.trials += 1
    keys = {v[0] for v in results.values()}
    if len(keys) == 1:
        failure = tuple(reps_i[0] for reps_i in reps)  # each class list starts with the failure tag's group
        _, d, after = results[failure]
        if with_random:
            rng.setstate(after)  # type: ignore[arg-type]
        d.request = request  # only the tags actually known
        d.decide_us = (timer() - start) * 1e6
        out.decision = d
        out.skipped = {c: _why_skipped(c, classes[c], d) for c in pending}
        return out
    # which classifiers matter: changing its tag alone changes the outcome somewhere
    for i, name in enumerate(pending):
        matters = False
        for combo, (key, _, _) in results.items():
            for other in reps[i]:
                if other == combo[i]:
                    continue
                alt = combo[:i] + (other,) + combo[i + 1:]
                if results[alt][0] != key:
                    matters = True
                    break
            if matters:
                break
        if matters:
            out.needed.append(name)
        else:
            out.skipped[name] = (f"its tags ({', '.join(t for g in classes[name] for t in g)}) "
                                 "do not change the outcome once the others are known")
    return out
