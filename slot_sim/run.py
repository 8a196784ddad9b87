"""Deterministic simulation of a block's shard slots, as FoundationDB and TigerBeetle's VOPR check theirs.

Every slot of a search's blocks runs the production rules (:class:`~mop_airflow.slots.machine.SlotMachine`)
on one virtual clock (:mod:`~slot_sim.world`), against an in-memory store and an
Airflow that inject what a deployment does: hop durations, store latency, requests that fail and are
retried, 409s on exclusive creates, listings that show new names late, a slot SIGKILLed (it loses what
it had not committed; Airflow retries it after a delay, up to ``retries``) or SIGSTOPped (its watchdog
kills it after the stall bound), a pool held elsewhere, a scheduler that starts tasks late,
configurations that fail or diverge at a drawn hop (:mod:`~slot_sim.shapes`). Hops
sit where production puts them (:func:`~mop_airflow.slots.driver.block_hops`), ASHA decides with
production's :func:`~mop_airflow.search.asha.next_jobs` (:mod:`~slot_sim.asha`).
Everything is drawn from one ``random.Random(seed)``: a schedule is its seed, and replaying it gives the
same trace.

After each schedule :func:`check` verifies the invariants (:data:`INVARIANTS`) and :func:`diagnose` names
the known bug a violation shows. ``python -m slot_sim --schedules 1000000 --workers 2``
runs many; a violation prints its seed, and ``--seed N`` replays it with its trace.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time

from mop_airflow.slots import machine as sp
from slot_sim.shapes import after, describe, oracle
from slot_sim.world import World

INVARIANTS = (
    "every hop of a configuration that did not fail is committed exactly once, in its order, from the "
    "state its previous hop left, on its shard; no record is written twice; no hop reads a checkpoint gone",
    "the search ends (every slot's task done or failed for good) within the bound of virtual time",
    "within the fault envelope (infrastructure faults the protocol must absorb) the search succeeds",
    "a search that succeeded leaves every configuration as a run without infrastructure faults does",
    "a failed configuration is recorded with its cause: the hop and shard it failed at",
    "ASHA takes each decision once, never promotes a configuration twice, never exceeds its budget, "
    "and ends with every configuration finished, stopped or failed",
)


def check(w: World) -> list[str]:
    """The invariants (:data:`INVARIANTS`) over what the schedule left; the violations, in words."""
    s, out = w.s, list(w.violations)
    ok = {k: r for k, r in w.records.items() if r.status == "ok"}
    first_failure: dict = {}
    for (cid, t), r in sorted(w.records.items()):
        if r.status != "ok" and r.dropped_after is None and cid not in first_failure:
            first_failure[cid] = r
    for (cid, t), r in sorted(ok.items()):
        if cid in first_failure and t > first_failure[cid].t:
            out.append(f"{cid} t={t} trained after {cid} failed at hop {first_failure[cid].t}")
    for (cid, t), r in sorted(w.records.items()):
        if r.dropped_after is not None:
            cause = w.records.get((cid, r.dropped_after))
            if cause is None or cause.status == "ok" or cause.dropped_after is not None or r.error != cause.error:
                out.append(f"{cid} t={t}: settled as dropped after hop {r.dropped_after}, which is not its failure")
    if s.method == "asha":
        out += _check_asha(w, ok, first_failure)
    else:
        trained, final = oracle(s)
        for key, r in sorted(ok.items()):
            if trained.get(key) != r.checkpoint_sha256:
                out.append(f"{key[0]} t={key[1]}: checkpoint {r.checkpoint_sha256:x} where a run without faults has "
                           f"{trained.get(key) or 0:x} (trained from another state, or on another shard)")
        if w.outcome == "succeeded":
            missing = sorted(set(trained) - set(ok))
            if missing:
                out.append(f"the search succeeded without hops {missing[:5]}")
            for cid, end in sorted(final.items()):
                got = first_failure.get(cid)
                if end[0] == "ok" and got is not None:
                    out.append(f"{cid} recorded failed at hop {got.t} ({got.error}), but it does not fail")
                if end[0] == "failed" and (got is None or (got.t, got.shard, got.status) != end[1:]
                                           or f"hop {end[1]} on shard {end[2]}" not in (got.error or "")):
                    out.append(f"{cid} fails at hop {end[1]} on shard {end[2]} ({end[3]}), but its record says "
                               f"{None if got is None else (got.t, got.shard, got.status, got.error)}")
    if s.benign and w.outcome != "succeeded" and not w.violations:
        out.append(f"the search {w.outcome} though every fault was within the envelope: " + w._stuck())
    return out


def _check_asha(w: World, ok: dict, first_failure: dict) -> list[str]:
    s, out, p = w.s, [], w.s.shards
    decisions = [w.decisions[k][1] for k in sorted(w.decisions)]
    if [d["k"] for d in decisions] != list(range(len(decisions))):
        out.append("ASHA's decisions are not numbered in sequence")
    jobs = [job for d in decisions for job in d["jobs"]]
    pairs = [(j["config_id"], j["rung"]) for j in jobs]
    if len(set(pairs)) != len(pairs):
        out.append(f"ASHA handed a (configuration, rung) twice: {sorted(pairs)}")
    handed = sum(j["job"].iterations - (s.rungs[j["rung"] - 1] if j["rung"] else 0) for j in jobs)
    if s.budget is not None and (handed > s.budget or len(ok) > s.budget * p):
        out.append(f"ASHA handed {handed} iterations and trained {len(ok) / p:.1f}, over its budget of {s.budget}")
    leg_of = {}
    for j in jobs:
        for t in range(j["first"], j["end"]):
            leg_of[j["config_id"], t] = j
    index = s.index
    for (cid, t), r in sorted(ok.items()):
        j = leg_of.get((cid, t))
        if j is None:
            out.append(f"{cid} t={t} trained though no decision handed it")
            continue
        before = j["from"] if t == j["first"] else sp.state_after(ok[cid, t - 1]) if (cid, t - 1) in ok else None
        shard = (j["offset"] + t) % p
        if before is None or after(before, index[cid], t, shard).checkpoint_sha256 != r.checkpoint_sha256:
            out.append(f"{cid} t={t} was not trained from the state its hop {t - 1} left, on shard {shard}")
    for cid, r in sorted(first_failure.items()):
        drawn = s.fail.get(cid)
        if not ((drawn == (r.t, r.status) and f"hop {r.t} on shard {r.shard}" in (r.error or ""))
                or "was given up" in (r.error or "")):
            out.append(f"{cid} recorded failed at hop {r.t} with cause {r.error!r}, not its own")
    if w.outcome == "succeeded":
        if not decisions or not decisions[-1]["finished"]:
            out.append("ASHA's slots ended but its last decision is not 'finished'")
        else:
            done = {(c.config_id, c.rung) for c in decisions[-1]["completions"]}
            missing = sorted(set(pairs) - done)
            if missing:
                out.append(f"ASHA finished without the completions of {missing[:5]}")
        for j in jobs:
            cid = j["config_id"]
            if cid not in first_failure and any((cid, t) not in ok for t in range(j["first"], j["end"])):
                out.append(f"{cid}'s leg to rung {j['rung']} did not train whole and it did not fail")
    return out


def run_one(seed: int, rules: sp.Rules = sp.Rules(), trace: bool = False) -> World:
    # the rules before a fix replay their bug in the world it was found in: without the peer faults of
    # issue 70 (slot_sim.peers), which the protocol before them does not absorb
    old = any(rules == RULES[name] for name in OLD_WORLD)
    world = World(seed, rules, trace=trace, peers=not old).run()
    world.problems = check(world)
    return world


RULES = {
    # production's rules: a retry marks a hop it finds committed, a slot waiting a minute looks its
    # input's record up (seeds 164, 432, 1909), a peer silent on its last try ended for good and ASHA
    # fails a leg whose next hop is on such a slot (seeds 544, 1581, 539): each found by this simulation
    "production": sp.Rules(),
    "before-marks": sp.Rules(mark_found=False, look_after=None, last_try_dies=False, asha_dead_legs=False,
                             yield_bound=False, absent_peers=False),
    # before those two fixes (and before yields were bounded, which also ends seed 544)
    "before-last-try": sp.Rules(last_try_dies=False, asha_dead_legs=False, yield_bound=False, absent_peers=False),
    # before a given-up hop's input was looked up (and before ASHA ended a try whose peer had not started,
    # which also ends seed 212597)
    "before-given-up-looks": sp.Rules(look_given_up=False, absent_peers=False),
    "no-settle": sp.Rules(settle_forward=False),
    "proposed": sp.Rules(yield_bound=True),
}
OLD_WORLD = ("before-marks", "before-last-try", "before-given-up-looks", "no-settle")


def _chunk(args: tuple) -> tuple:
    first, count, rules = args
    bad = []
    events, late = 0, 0.0
    for seed in range(first, first + count):
        world = run_one(seed, RULES[rules])
        events += world.events
        if world.problems:
            bad.append((seed, world.problems[0], describe(world.s), diagnose(world)))
        elif world.outcome == "succeeded":
            late = max(late, world.now / world.bound)
    return count, events, bad, late


def _machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}"


def run_many(first: int, count: int, rules: str = "production", *, workers: int = 1, seconds: float = 0,
             progress: int = 0) -> tuple[int, int, list, float]:
    """Run seeds ``first`` to ``first + count - 1`` (in chunks, on ``workers`` processes; stopping after
    ``seconds`` if given): how many ran, their events, each violation ``(seed, what, shape, diagnosis)``,
    and the latest a search that succeeded ended, as a share of its time bound."""
    began = time.perf_counter()
    size = max(1, min(500, count // (workers * 8) or 1))
    chunks = [(s, min(size, first + count - s), rules) for s in range(first, first + count, size)]
    done, events, bad, late, told = 0, 0, [], 0.0, 0

    def tally(result: tuple) -> bool:
        nonlocal done, events, bad, late, told
        done, events, bad, late = done + result[0], events + result[1], bad + result[2], max(late, result[3])
        if progress and done - told >= progress:
            told = done
            print(f"... {done} schedules, {len(bad)} with a violated invariant, {time.perf_counter() - began:.0f} s",
                  flush=True)
        return bool(seconds) and time.perf_counter() - began > seconds

    if workers > 1:
        import multiprocessing  # noqa: PLC0415

        # spawn, not fork: a caller with threads (a pytest-xdist worker, whose earlier tests left some) may
        # hold a lock at the fork that the child then waits on for ever (a 10,000-schedule test hung so)
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            for result in pool.imap(_chunk, chunks):  # in order: the seeds run are one range
                if tally(result):
                    pool.terminate()
                    break
    else:
        for chunk in chunks:
            if tally(_chunk(chunk)):
                break
    return done, events, sorted(bad), late


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slot_sim", description=__doc__.split("\n")[0])
    parser.add_argument("--schedules", type=int, default=10_000, help="how many schedules (seeds) to run")
    parser.add_argument("--first", type=int, default=0, help="the first seed")
    parser.add_argument("--workers", type=int, default=1, help="processes to run them in")
    parser.add_argument("--rules", choices=sorted(RULES), default="production", help="the protocol's rules")
    parser.add_argument("--seed", type=int, help="replay this one seed and print its trace")
    parser.add_argument("--show", type=int, default=10, help="violations to print")
    parser.add_argument("--progress", type=int, default=0, help="print a line every this many schedules")
    parser.add_argument("--seconds", type=float, default=0, help="stop after this long (0: never), reporting the "
                        "schedules run")
    args = parser.parse_args(argv)
    if args.seed is not None:
        world = run_one(args.seed, RULES[args.rules], trace=True)
        print("\n".join(world.trace))
        print(f"seed {args.seed}: {describe(world.s)}; {world.outcome} at {world.now:.1f} s (bound "
              f"{world.bound:.0f} s)")
        print("\n".join(f"VIOLATED: {p}" for p in world.problems) or "no invariant violated")
        return 1 if world.problems else 0
    began = time.perf_counter()
    done, events, bad, late = run_many(args.first, args.schedules, args.rules, workers=args.workers,
                                       seconds=args.seconds, progress=args.progress)
    seconds = time.perf_counter() - began
    for seed, problem, shape, why in bad[:args.show]:
        print(f"seed {seed}: {problem[:400]}\n    {shape}\n    diagnosis: {why}")
    kinds: dict = {}
    for seed, _, _, why in bad:
        kinds.setdefault(why, []).append(seed)
    for why, seeds in sorted(kinds.items(), key=lambda kv: -len(kv[1])):
        print(f"{len(seeds):7d} x {why} (seeds {', '.join(map(str, seeds[:8]))}{' ...' if len(seeds) > 8 else ''})")
    print(f"{done} schedules (seeds {args.first} to {args.first + done - 1}, rules {args.rules}), {len(bad)} with a "
          f"violated invariant, {events} events, {seconds:.1f} s on {_machine()}, the slowest search that "
          f"succeeded ended at {late:.0%} of its time bound, "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    if bad:
        print(f"replay one: python -m slot_sim --seed {bad[0][0]} --rules {args.rules}")
    return 1 if bad else 0


def diagnose(w: World) -> str:
    """Which known failure a violated schedule shows (for the report; the invariants decide)."""
    stuck = [t for t in w.tasks if t.state in ("running", "queued") and t.proc is not None]
    waits = set()
    for task in stuck:
        m = task.proc.machine
        for h in list(m.pending) + list(m.given_up.values()):
            waits.add((task.block.index, task.shard, task.slot, h.config_id, h.hop - 1))
    missed = [w.missed[k] for k in sorted(waits) if k in w.missed]
    if missed:
        return f"a marker never listed ({missed[0]})"
    if not w.rules.settle_forward and any(r.status != "ok" for r in w.records.values()):
        return "a failed configuration's later hop never settled (the old rule)"
    if any((k[3], k[4]) in w.unmarked for k in waits):
        return "a retry found its hop committed but never marked it"
    dead = {t.shard_slot for t in w.tasks if t.state == "failed" and (t.word is None or not t.word[1].final)}
    if any(t.yields > 2 for t in stuck) and dead:
        return "a slot yields for ever to a slot killed on its last try (no final word)"
    if w.s.method == "asha":
        if any(m.given_up for m in (t.proc.machine for t in stuck)):
            return "ASHA: a hop given up whose slot never comes back"
        if any(t.state == "failed" for t in w.tasks):
            return "ASHA: a leg's hop on a slot failed for good, which no slot waits for"
    return "other"


if __name__ == "__main__":
    sys.exit(main())
