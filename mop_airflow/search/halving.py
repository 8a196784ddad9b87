"""Hyperband and successive halving as answers to "what trains next?" (:mod:`mop_airflow.search.jobs`).

The brackets are planned exactly (:mod:`mop_airflow.search.hyperband`: Algorithm 1, paper or MADlib
rounding) and run side by side, MADlib's "on the diagonal". A bracket's rung is synchronous, as in
the paper: its configurations are ranked together once every one of them has completed the rung
(or failed), and the best ``keep`` go on to the next rung (:func:`mop_airflow.search.promotion.promote`).
Brackets do not wait for each other. Every bracket's rung 0 starts as soon as capacity allows, the
longest bracket first.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from mop_airflow.errors import SpecError
from mop_airflow.search.hyperband import Bracket
from mop_airflow.search.jobs import Completion, Job
from mop_airflow.search.promotion import promote


def rung_iterations(bracket: Bracket) -> list[int]:
    """Where each rung of ``bracket`` ends, in whole iterations: a bracket's rungs end at iteration
    boundaries (the plan refuses any other, :func:`mop_airflow.search.hyperband.hyperband_plan`)."""
    return [int(rung.r_i) for rung in bracket.rungs]


def halving_jobs(brackets: Sequence[Bracket], members: Mapping[int, Sequence[str]],
                 completions: Sequence[Completion], promoted: Sequence[tuple[str, int]], started: Sequence[str],
                 free: int, *, direction: str) -> list[Job]:
    """Up to ``free`` jobs: promotions of completed rungs first (bracket by bracket, longest first),
    then rung-0 starts. ``members[s]``: bracket ``s``'s configurations from the seeded draw;
    ``promoted``: the (config_id, rung) pairs already promoted from that rung; ``started``: the
    configurations started. The other arguments are those of :func:`mop_airflow.search.asha.next_jobs`."""
    if free < 0:
        raise SpecError("free", free, "must be >= 0", "pass the capacity that is free now")
    done: dict[tuple[int | None, int], list[Completion]] = {}
    for c in completions:
        done.setdefault((c.bracket, c.rung), []).append(c)
    taken, begun = set(promoted), set(started)
    jobs: list[Job] = []
    for bracket in sorted(brackets, key=lambda b: -b.s):
        ends = rung_iterations(bracket)
        expected = list(members.get(bracket.s, ()))
        for i, rung in enumerate(bracket.rungs[:-1]):
            results = done.get((bracket.s, i), [])
            if not expected or len(results) < len(expected):
                break  # the rung is still training: its bracket waits here (a synchronous rung)
            winners, _ = promote([c.result() for c in results], keep=rung.keep, direction=direction)
            metric = {c.config_id: c.metric for c in results}
            for place, cid in enumerate(winners):
                if (cid, i) not in taken and len(jobs) < free:
                    jobs.append(Job(cid, i + 1, "promote", ends[i + 1], bracket=bracket.s, metric=metric[cid],
                                    rank=place + 1, of=len(results)))
                    taken.add((cid, i))
            expected = winners
    for bracket in sorted(brackets, key=lambda b: -b.s):
        first = rung_iterations(bracket)[0]
        for cid in members.get(bracket.s, ()):
            if len(jobs) >= free:
                return jobs
            if cid not in begun:
                jobs.append(Job(cid, 0, "start", first, bracket=bracket.s))
                begun.add(cid)
    return jobs

