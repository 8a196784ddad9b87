"""Deterministic simulation of a block's shard slots, as FoundationDB and TigerBeetle's VOPR check theirs.

Every slot of a search's blocks runs the production rules (:class:`~mop_airflow.slots.machine.SlotMachine`)
on one virtual clock (:mod:`~slot_sim.world`), against an in-memory store and an
Airflow that inject what a deployment does: hop durations, store latency, requests that fail and are
retried, 409s on exclusive creates, listings that show new names late, a slot SIGKILLed (it loses what
it had not committed; Airflow retries it after a delay, up to ``retries``) or SIGSTOPped (its watchdog
kills it after the stall bound), a pool held elsewhere, a scheduler that starts tasks late,
configurations that fail or diverge at a drawn hop (:mod:`~slot_sim.shapes`). Hops
sit where production puts them (:func:`~mop_airflow.planning.placement.block_hops`), ASHA decides with
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
from collections import Counter

from mop_airflow.search import promotion
from mop_airflow.slots import machine as sp
from slot_sim.liveness import allowance, fault_free_floor, reference_shape
from slot_sim.oracle import asha_job, best_first, reference
from slot_sim.planted import BUGS, PENDING, planted
from slot_sim.shapes import after, describe, metric
from slot_sim.world import World

INVARIANTS = (
    "every hop of a configuration that did not fail is committed exactly once, in its order, from the "
    "state its previous hop left, on its shard; no record is written twice; no hop reads a checkpoint gone",
    "the search ends (every slot's task done or failed for good) within its bound of virtual time and events; "
    "within the fault envelope, by the time it takes without faults plus the stated cost of each fault "
    "(slot_sim.liveness.COSTS)",
    "within the fault envelope (infrastructure faults the protocol must absorb) the search succeeds",
    "a search that succeeded leaves every configuration as a run without infrastructure faults does",
    "a failed configuration is recorded with its cause: the hop and shard it failed at",
    "ASHA takes each decision once, by its rule (the reference's get_job), never promotes a configuration "
    "twice, never exceeds its budget, and ends with every configuration finished, stopped or failed",
    "a search that succeeded ranks its leaderboard (production's ranking) as the reference does, winner first",
)


def check(w: World, clean: World | None = None) -> list[str]:
    """The invariants (:data:`INVARIANTS`) over what the schedule left; the violations, in words. ``clean``:
    the same search run without its faults (:func:`~slot_sim.liveness.reference_shape`), whose time the
    liveness invariant adds the faults' costs to (None: not needed, :func:`needs_clean`; the schedule's time
    allowed, which the report's "latest end" reads, is then its bound)."""
    s, out = w.s, list(w.violations)
    if clean is not None and s.benign and not w.violations:
        if clean.outcome != "succeeded":
            out.append(f"the search without its faults {clean.outcome} at {clean.now:.0f} s: {clean.violations[:1]}")
        elif w.outcome == "succeeded":
            extra, parts = allowance(s, w)
            # ASHA's decisions follow the order its completions land in, so a run with faults may hand out
            # other jobs (on other shards: other metrics) than the one without: its reference time is
            # scaled to the training it did, all of it or its longest chain (a configuration's hops, one
            # after another), whichever grew more (seed 418446 promoted one configuration to its last rung
            # where the run without faults finished it a rung before: 24 hops more, one after another)
            work = 1.0 if s.method != "asha" else max(1.0, _work(w, s) / max(_work(clean, s), 1e-9),
                                                      _chain(w, s) / max(_chain(clean, s), 1e-9))
            w.allowed = clean.now * work + extra
            if w.now > w.allowed:
                out.append(f"the search ended at {w.now:.0f} s, past the {clean.now:.0f} s it takes without faults "
                           f"plus {extra:.0f} s for its faults ({', '.join(parts)})")
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
        ref = reference(s)
        trained, final = ref.trained, ref.final
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
            out += _check_leaderboard(w, ok, first_failure, ref.leaderboard)
    if s.benign and w.outcome != "succeeded" and not w.violations:
        out.append(f"the search {w.outcome} though every fault was within the envelope: " + w._stuck())
    return out


def needs_clean(w: World) -> bool:
    """Whether the liveness invariant needs the search run without its faults: a search within the envelope
    that succeeded, later than the least that run can take (:func:`~slot_sim.liveness.fault_free_floor`)
    plus its faults' costs. Most end well within that, and the run without faults was a third of the CPU."""
    s = w.s
    return (s.benign and not w.violations and w.outcome == "succeeded"
            and w.now > fault_free_floor(s) + allowance(s, w)[0])


def _seconds(w: World, s) -> dict:
    """Each configuration's seconds of training in the hops a schedule committed, by the durations of ``s``."""
    hops = Counter(cid for (cid, _), r in w.records.items() if r.status == "ok")
    return {cid: s.durations[cid] * n for cid, n in hops.items()}


def _work(w: World, s) -> float:
    """The seconds of training a schedule's committed hops take."""
    return sum(_seconds(w, s).values())


def _chain(w: World, s) -> float:
    """The seconds of training of the configuration that trained the longest (its hops, one after another)."""
    return max(_seconds(w, s).values(), default=0.0)


def _leaderboard(scores: dict) -> list[str]:
    """Production's ranking (:func:`~mop_airflow.search.promotion.rank_rung`) of ``config -> metric``."""
    ranked = promotion.rank_rung([{"config_id": cid, "metric": m, "status": "ok"} for cid, m in sorted(scores.items())],
                       direction="min")
    return [r["config_id"] for r in ranked]


def _check_leaderboard(w: World, ok: dict, first_failure: dict, expected: list) -> list[str]:
    """The configurations that trained the most hops, ranked by production's rule, against the reference's."""
    if w.outcome != "succeeded":
        return []
    last: dict = {}
    for cid, t in ok:
        if cid not in first_failure:
            last[cid] = max(last.get(cid, -1), t)
    most = max(last.values(), default=-1)
    got = _leaderboard({cid: metric(ok[cid, t].checkpoint_sha256) for cid, t in last.items() if t == most})
    if got != expected:
        return [f"the leaderboard ranks {got[:5]} where the reference ranks {expected[:5]} (winner "
                f"{got[0] if got else None}, not {expected[0] if expected else None})"]
    return []


def _check_asha_rule(w: World, decisions: list) -> list[str]:
    """Each decision's job is the one ASHA's rule (the reference's get_job) hands out from the completions
    that decision saw; the search finishes only when the rule hands nothing and nothing is in flight; the
    leaderboard (the top rung reached, production's ranking) is the reference's."""
    out, jobs = [], []
    for d in decisions:
        seen = [(c.config_id, c.rung, c.metric if c.status == "ok" else None) for c in d["completions"]]
        want = asha_job(w.s, seen, jobs, w.capacity)
        got = None if d["finished"] else (d["jobs"][0]["config_id"], d["jobs"][0]["rung"], d["jobs"][0]["kind"])
        if got != want and not (got is None and want is None):
            out.append(f"ASHA's decision {d['k']} hands {got} where its rule hands {want} (from completions "
                       f"{seen[-6:]})")
            return out
        if got is None:
            flying = {(cid, rung) for cid, rung, _ in jobs} - {(cid, rung) for cid, rung, _ in seen}
            if flying:
                out.append(f"ASHA finished at decision {d['k']} with {sorted(flying)[:4]} still in flight")
        else:
            jobs.append(got)
    if w.outcome == "succeeded" and decisions and decisions[-1]["finished"]:
        seen = [(c.config_id, c.rung, c.metric) for c in decisions[-1]["completions"] if c.status == "ok"]
        top = max((rung for _, rung, _ in seen), default=0)
        scores = {cid: m for cid, rung, m in seen if rung == top}
        got, want = _leaderboard(scores), best_first(scores)
        if got != want:
            out.append(f"ASHA's leaderboard ranks {got[:5]} where the reference ranks {want[:5]}")
    return out


def _check_asha(w: World, ok: dict, first_failure: dict) -> list[str]:
    s, out, p = w.s, [], w.s.shards
    decisions = [w.decisions[k][1] for k in sorted(w.decisions)]
    if [d["k"] for d in decisions] != list(range(len(decisions))):
        out.append("ASHA's decisions are not numbered in sequence")
    out += _check_asha_rule(w, decisions)
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
                or "was given up" in (r.error or "") or "never trained" in (r.error or "")):
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


def run_one(seed: int, rules: sp.Rules | None = None, trace: bool = False, bug: str | None = None) -> World:
    """Schedule ``seed`` under ``rules`` (production's by default), or with planted bug ``bug``
    (:mod:`slot_sim.planted`), checked against the reference and against its run without faults (that one
    under production's rules, no bug planted). The rules before a fix replay their bug in the world it was
    found in: without the peer faults of issue 70 (:mod:`slot_sim.peers`), which they do not absorb."""
    rules = rules or sp.Rules()
    peers = not any(rules == RULES[name] for name in OLD_WORLD)

    def raised(exc: Exception) -> World:  # production (or the world) raised: a violation with its seed
        world.violate(f"the schedule raised {type(exc).__name__}: {exc}"[:600])
        world.problems = list(world.violations)
        return world

    with planted(bug) as bug_rules:
        world = World(seed, rules if bug is None else bug_rules, trace=trace, peers=peers)
        try:
            world.run()
        except Exception as exc:  # noqa: BLE001
            return raised(exc)
    # the run without faults: under production's rules, no bug planted
    clean = World(seed, sp.Rules(), shape=reference_shape(world.s), peers=False).run() if needs_clean(world) else None
    with planted(bug):
        try:
            world.problems = check(world, clean)
        except Exception as exc:  # noqa: BLE001
            return raised(exc)
    return world


def first_caught(bug: str, first: int = 0, limit: int = 2_000) -> int | None:
    """The first seed from ``first`` whose schedule violates an invariant with ``bug`` planted (None: none
    of ``limit``)."""
    for seed in range(first, first + limit):
        if run_one(seed, bug=bug).problems:
            return seed
    return None


RULES = {
    # production's rules: a retry marks a hop it finds committed, a slot waiting a minute looks its
    # input's record up (seeds 164, 432, 1909), a peer silent on its last try ended for good and ASHA
    # fails a leg whose next hop is on such a slot (seeds 544, 1581, 539): each found by this simulation
    "production": sp.Rules(),
    # (each before the fence too, which came later: the seeds replay as they were found)
    "before-marks": sp.Rules(mark_found=False, look_after=None, last_try_dies=False, asha_dead_legs=False,
                             yield_bound=False, absent_peers=False, fence=False, lost_ends_block=False,
                             marks_in_order=False, retry_looks=False, yield_checks=False),
    # before those two fixes (and before yields were bounded, which also ends seed 544)
    "before-last-try": sp.Rules(last_try_dies=False, asha_dead_legs=False, yield_bound=False, absent_peers=False,
                                fence=False, lost_ends_block=False, marks_in_order=False, retry_looks=False,
                                yield_checks=False),
    # before a given-up hop's input was looked up (and before ASHA ended a try whose peer had not started,
    # which also ends seed 212597)
    "before-given-up-looks": sp.Rules(look_given_up=False, absent_peers=False, fence=False, lost_ends_block=False,
                                      marks_in_order=False, retry_looks=False, yield_checks=False),
    "no-fence": sp.Rules(fence=False),  # two copies of one slot write over each other (issue 70)
    "no-settle": sp.Rules(settle_forward=False),
}
OLD_WORLD = ("before-marks", "before-last-try", "before-given-up-looks", "no-settle")


def _chunk(args: tuple) -> tuple:
    first, count, rules, bug = args
    bad = []
    events, late = 0, 0.0
    for seed in range(first, first + count):
        world = run_one(seed, RULES[rules], bug=bug)
        events += world.events
        if world.problems:
            bad.append((seed, world.problems[0], describe(world.s), diagnose(world)))
        elif world.outcome == "succeeded":
            late = max(late, world.now / (getattr(world, "allowed", None) or world.bound))
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
             progress: int = 0, bug: str | None = None, timeout: float = 0) -> tuple[int, int, list, float]:
    """Run seeds ``first`` to ``first + count - 1`` (in chunks, on ``workers`` processes; stopping after
    ``seconds`` if given; with planted bug ``bug``): how many ran, their events, each violation
    ``(seed, what, shape, diagnosis)``, and the latest a search that succeeded ended, as a share of its
    time allowed (the fault-free time plus its faults' costs; beyond the envelope, its bound).
    ``timeout`` (with ``workers`` > 1): past this many seconds of wall clock the workers are stopped and
    :class:`TimeoutError` names the seeds still running (a schedule that runs away inside one event)."""
    began = time.perf_counter()
    size = max(1, min(500, count // (workers * 8) or 1))
    chunks = [(s, min(size, first + count - s), rules, bug) for s in range(first, first + count, size)]
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
            results = pool.imap(_chunk, chunks)  # in order: the seeds run are one range
            for chunk in chunks:
                left = timeout - (time.perf_counter() - began) if timeout else None
                try:
                    result = results.next(timeout=None if left is None else max(0.0, left))
                except multiprocessing.TimeoutError:
                    pool.terminate()
                    raise TimeoutError(f"the schedules had not ended after {timeout:.0f} s: seeds {chunk[0]} to "
                                       f"{chunk[0] + chunk[1] - 1} still running ({done} done)") from None
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
    parser.add_argument("--bug", choices=sorted(BUGS), help="plant this bug (slot_sim.planted)")
    parser.add_argument("--planted", action="store_true", help="run every planted bug over the schedules and "
                        "print the table: the first seed that catches it, the schedules violated")
    parser.add_argument("--show", type=int, default=10, help="violations to print")
    parser.add_argument("--progress", type=int, default=0, help="print a line every this many schedules")
    parser.add_argument("--seconds", type=float, default=0, help="stop after this long (0: never), reporting the "
                        "schedules run")
    args = parser.parse_args(argv)
    if args.planted:
        return _table(args)
    if args.seed is not None:
        world = run_one(args.seed, RULES[args.rules], trace=True, bug=args.bug)
        print("\n".join(world.trace))
        print(f"seed {args.seed}: {describe(world.s)}; {world.outcome} at {world.now:.1f} s (bound "
              f"{world.bound:.0f} s)")
        print("\n".join(f"VIOLATED: {p}" for p in world.problems) or "no invariant violated")
        return 1 if world.problems else 0
    began = time.perf_counter()
    done, events, bad, late = run_many(args.first, args.schedules, args.rules, workers=args.workers,
                                       seconds=args.seconds, progress=args.progress, bug=args.bug)
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
          f"succeeded ended at {late:.0%} of its time allowed, "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    if bad:
        print(f"replay one: python -m slot_sim --seed {bad[0][0]} --rules {args.rules}")
    return 1 if bad else 0


def _row(args: tuple) -> tuple:
    """One planted bug: the first seed that catches it (hunted from its start, up to ``hunt`` seeds) and
    the schedules it violates of ``n`` from there."""
    name, first, n, hunt = args
    start = first + BUGS[name].hunt_from
    caught = first_caught(name, start, hunt)
    return name, start, caught, run_many(start, n, bug=name)[2]


def _table(args: argparse.Namespace) -> int:
    """Every planted bug: the table the docs show (one bug a process, ``--workers`` at once). Exit 1 if
    one survives."""
    began, n, survived = time.perf_counter(), args.schedules, 0
    hunt = max(n, 2_000)
    print(f"| planted bug | first seed that catches it (of {hunt:,} hunted) | schedules violated of {n:,} |\n"
          "|---|---|---|", flush=True)
    rows = [(name, args.first, n, hunt) for name in BUGS]
    if args.workers > 1:
        import multiprocessing  # noqa: PLC0415

        with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
            results = list(pool.imap(_row, rows))
    else:
        results = [_row(row) for row in rows]
    for name, start, caught, bad in results:
        bug = BUGS[name]
        survived += caught is None and bug.needs is None
        seeds = f" (hunted from seed {start:,})" if bug.hunt_from else ""
        needs = f" (needs {bug.needs})" if bug.needs else ""
        print(f"| {name} | {'**none**' if caught is None else f'{caught:,}'}{seeds} | {len(bad):,}{needs} |")
    for name, why in PENDING.items():
        print(f"| {name} | not plantable yet | {why} |")
    print(f"\nseeds {args.first:,} on, {time.perf_counter() - began:.0f} s on {_machine()}, "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    return 1 if survived else 0


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
