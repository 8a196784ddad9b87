"""The slot simulation's reference: what each search method does without faults, written from the papers.

Independent of the code under test: nothing here imports :mod:`mop_airflow` (a test checks it), so a
bug in production's ranking, promotion or bracket rules cannot hide by being in the reference too, as
Jepsen checks histories against a model of its own. It is fed the simulated metrics: a hop's
checkpoint is a hash chain (:func:`~slot_sim.shapes.after`), its metric a function of that hash
(:func:`~slot_sim.shapes.metric`, lower is better), and the world's physics are the simulation's, not
a rule of the product.

- **grid**: every configuration trains every hop; the leaderboard ranks them by their last metric.
- **successive halving** (Jamieson and Talwalkar 2016; the inner loop of Hyperband's Algorithm 1): after
  each rung keep the best ``floor(n_i / eta)`` of the ``n_i`` that completed it (a configuration that
  failed has no loss to rank and does not count), at least one while any completed.
- **Hyperband** (Li et al., JMLR 2018, Algorithm 1): ``s_max = floor(log_eta R)``; bracket ``s`` starts
  ``n = ceil((s_max + 1) / (s + 1) * eta^s)`` configurations at ``r = R * eta^-s`` and halves them as
  above, to ``R``; the brackets run side by side, taking the configurations in order.
- **PBT** (Jaderberg et al. 2017, truncation selection): at each boundary the members that trained are
  ranked; each of the bottom quarter (at least one, with two or more members) copies the checkpoint of
  the member as many places from the top (exploit) and perturbs it (explore: in the simulation a new
  hash of the donor's checkpoint and the taker).
- **ASHA** (Li et al., MLSys 2020, Algorithm 2, get_job): for rung ``k`` from the top down, the best
  ``floor(|D_k| / eta)`` of the configurations that completed rung ``k`` (failed ones counted and never
  promoted), not promoted from it yet, the best first, is promoted to ``k + 1``; else a new one starts,
  until ``n`` started. Under a budget a leg is handed out only if it ends by the budget's last block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from slot_sim.shapes import after, metric, mix


@dataclass
class Reference:
    """What a run without infrastructure faults leaves."""

    trained: dict = field(default_factory=dict)  # (config, hop) -> checkpoint
    final: dict = field(default_factory=dict)  # config -> ("ok", hops trained, checkpoint) | ("failed", hop, shard, status)
    reached: dict = field(default_factory=dict)  # config -> hops trained (ok) when it stopped
    leaderboard: list = field(default_factory=list)  # configurations that trained the most hops, best first

    @property
    def winner(self) -> str | None:
        return self.leaderboard[0] if self.leaderboard else None


def hyperband_brackets(R: int, eta: int) -> list[tuple[int, tuple[int, ...]]]:
    """Algorithm 1's brackets, most exploratory first: ``(n, rung ends)``."""
    s_max = 0
    while eta ** (s_max + 1) <= R:
        s_max += 1
    out = []
    for s in range(s_max, -1, -1):
        n = math.ceil((s_max + 1) * eta ** s / (s + 1))
        r = R // eta ** s
        out.append((n, tuple(r * eta ** i for i in range(s + 1))))
    return out


def best_first(scores: dict) -> list[str]:
    """Configuration ids by metric, lower first, ties to the lower id."""
    return sorted(scores, key=lambda cid: (scores[cid], cid))


def reference(s) -> Reference:
    """The fault-free run of shape ``s`` (a :class:`~slot_sim.shapes.Shape`; ASHA's is checked decision by
    decision, :func:`asha_job`)."""
    p, ref = s.shards, Reference()
    number = {cid: i for i, cid in enumerate(s.configs)}
    state = {cid: (-1, 0) for cid in s.configs}  # config -> (last hop, checkpoint)

    def train(cid: str, to: int) -> bool:
        """Train ``cid`` up to hop ``to - 1``; False if it failed on the way."""
        t, sha = state[cid]
        while t + 1 < to:
            t += 1
            shard = (number[cid] + t) % p
            fail = s.fail.get(cid)
            if fail is not None and fail[0] == t:
                ref.final[cid] = ("failed", t, shard, fail[1])
                return False
            sha = after(_State(cid, t - 1, sha), number[cid], t, shard).checkpoint_sha256
            ref.trained[cid, t] = sha
            state[cid] = (t, sha)
        return True

    def halve(members: list, ends: tuple) -> None:
        for i, end in enumerate(ends):
            alive = [cid for cid in members if train(cid, end * p)]
            if i == len(ends) - 1 or not alive:
                return
            ranked = best_first({cid: metric(state[cid][1]) for cid in alive})
            members = ranked[:max(1, len(alive) // s.eta)]

    if s.method == "grid":
        for cid in s.configs:
            train(cid, s.iterations * p)
    elif s.method == "sha":
        halve(list(s.configs), s.rungs)
    elif s.method == "hyperband":
        R = max(ends[-1] for _, ends in s.brackets)
        i = 0
        for n, ends in hyperband_brackets(R, s.eta):
            halve(s.configs[i:i + n], ends)  # the brackets are independent: their order does not matter
            i += n
    elif s.method == "pbt":
        members = list(s.configs)
        for block in range(s.pbt_blocks):
            members = [cid for cid in members if train(cid, (block + 1) * p)]
            if block == s.pbt_blocks - 1 or len(members) < 2:
                continue
            ranked = best_first({cid: metric(state[cid][1]) for cid in members})
            q = max(1, len(ranked) // 4)
            for donor, taker in zip(ranked[:q], ranked[len(ranked) - q:]):
                if donor != taker:
                    state[taker] = (state[taker][0], mix(state[donor][1], number[taker], 77))
    else:
        raise ValueError(f"no fault-free reference for {s.method!r}: ASHA's decisions are checked one by one")
    for cid in s.configs:
        if cid not in ref.final:
            ref.final[cid] = ("ok", state[cid][0] + 1, state[cid][1])
        ref.reached[cid] = state[cid][0] + 1
    ok = [cid for cid in s.configs if ref.final[cid][0] == "ok"]
    most = max((ref.reached[cid] for cid in ok), default=0)
    ref.leaderboard = best_first({cid: metric(state[cid][1]) for cid in ok if ref.reached[cid] == most})
    return ref


@dataclass(frozen=True)
class _State:
    config_id: str
    t: int
    checkpoint_sha256: int


def asha_job(s, completions: list, jobs: list, capacity: int) -> tuple | None:
    """Algorithm 2's get_job given the rung completions seen (in order: ``(config, rung, metric or None)``,
    None for a failure) and the jobs handed before (``(config, rung, kind)``): ``(config, rung, kind)``
    of the next job, or None when there is none (the search is over once none is in flight)."""
    rungs, eta = s.rungs, s.eta
    promoted = {(cid, rung - 1) for cid, rung, kind in jobs if kind == "promote"}
    started = [cid for cid, _, kind in jobs if kind == "start"]
    handed = sum(rungs[rung] - (rungs[rung - 1] if rung else 0) for _, rung, _ in jobs)
    deadline = None if s.budget is None else s.budget // capacity

    def fits(leg: int) -> bool:
        return deadline is None or handed // capacity + leg <= deadline

    for k in range(len(rungs) - 2, -1, -1):
        if not fits(rungs[k + 1] - rungs[k]):
            continue
        done = [(cid, m) for cid, rung, m in completions if rung == k]
        ok = best_first({cid: m for cid, m in done if m is not None})
        for cid in ok[:len(done) // eta]:
            if (cid, k) not in promoted:
                return cid, k + 1, "promote"
    if len(started) < len(s.configs) and fits(rungs[0]):
        fresh = next(cid for cid in s.configs if cid not in started)
        return fresh, 0, "start"
    return None
