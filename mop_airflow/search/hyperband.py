"""Hyperband and successive halving brackets, planned exactly before anything trains.

The plan follows Li et al., "Hyperband: A Novel Bandit-Based Approach to Hyperparameter
Optimization" (JMLR 18, 2018), Algorithm 1, with the resource measured in MOP iterations (one
iteration = every configuration visits every shard once). All arithmetic is on integers and
fractions: ``s_max = floor(log_eta(R))`` is found by multiplying (``math.log(243, 3)`` is
4.999999999999999 and ``math.log(1000, 10)`` is 2.9999999999999996, so a float log loses a
bracket), ``n = ceil((s_max + 1) * eta**s / (s + 1))``, ``r = R / eta**s``, and rung ``i`` of
bracket ``s`` trains ``n_i = floor(n / eta**i)`` configurations to ``r_i = r * eta**i``
iterations, then keeps the best ``floor(n_i / eta)`` (none after the last rung).

Two roundings of ``n`` (R=81, eta=3; each cell is n_i configurations at r_i iterations)::

    s | rounding="paper" (Algorithm 1)           | rounding="madlib"
    4 | 81@1  27@3  9@9  3@27  1@81              | 81@1  27@3  9@9  3@27  1@81
    3 | 34@3  11@9  3@27 1@81                    | 27@3   9@9  3@27 1@81
    2 | 15@9   5@27 1@81                         |  9@9   3@27 1@81
    1 |  8@27  2@81                              |  6@27  2@81
    0 |  5@81                                    |  5@81
      | 143 configurations                       | 128 configurations
      | 1581 iterations trained (1902 w/o resume)| 1404 iterations trained (1701 w/o resume)

"paper" rounds ``n`` up, so every bracket spends about the same budget ``B = (s_max + 1) * R``.
"madlib" is Apache MADlib's ``n = floor((s_max + 1) / (s + 1)) * eta**s``
(``madlib_keras_automl_hyperband.py_in``): fewer configurations in the middle brackets, and every
``n_i`` is an exact multiple of ``eta**(s - i)``. ``skip_last`` is also MADlib's: it drops the last ``skip_last``
rungs of every bracket, so brackets with ``s < skip_last`` vanish altogether (MADlib's unit test:
15 rungs for R=81, eta=3; 6 with skip_last=2; 3 with skip_last=3). Whenever every ``r_i`` is a
whole number, "madlib" reproduces MADlib's schedule table, except where MADlib's float arithmetic
slips and we keep the exact value: it takes ``s_max`` from ``math.log`` (R=243, eta=3 gives 4
there, 5 here) and truncates ``n * eta**-i`` in floats (its table shows 0 configurations in the
last rung for R=729, eta=3). Two things of MADlib's we do not copy: it rounds a fractional ``r_i``
to whole iterations (we reject it, below), and at each rung it trains ``r_i``
*more* iterations on top of the warm start, so its survivor of bracket 4 above trains
1+3+9+27+81 = 121 iterations instead of the paper's 81.

Resources: ``r_i`` is cumulative, what a configuration has received by the end of rung ``i``.
Promoted configurations resume from their checkpoint, so rung ``i`` only trains ``r_i - r_{i-1}``
more. ``total_resource_iterations`` is the paper's accounting (sum of ``n_i * r_i``, as if every
rung started from scratch); ``incremental_resource_iterations`` (sum of ``n_i * (r_i - r_{i-1})``)
is what MOP actually trains, and ``total_hops`` is that times ``shards``.

Rungs that end between iterations: ``r = R / eta**s`` need not be whole (R=4, eta=3 gives
r=4/3). A rung ranks configurations against each other, which is fair only when each has seen the
same data: at an iteration boundary every configuration has visited every shard equally often, but
in the middle of an iteration they have visited *different* shards. A block of hops ends at a rung's
end, at an iteration boundary, so a rung whose ``r_i`` is not a whole number of iterations is
rejected (choose R a multiple of ``eta**s_max``).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Union

from mop_airflow.errors import SpecError

ROUNDINGS = ("paper", "madlib")


def s_max(R: int, eta: int) -> int:
    """``floor(log_eta(R))`` in integers: the largest ``s`` with ``eta**s <= R``."""
    s, power = 0, eta
    while power <= R:
        s, power = s + 1, power * eta
    return s


@dataclass(frozen=True)
class Rung:
    """Rung ``i`` of bracket ``s``: ``n_i`` configurations trained to ``r_i`` iterations
    (= ``hops_i`` hops; ``new_hops`` of them in this rung when resuming), then the best ``keep``
    are promoted (0 after the last rung)."""

    s: int
    i: int
    n_i: int
    r_i: Fraction
    hops_i: int
    keep: int
    new_hops: int


@dataclass(frozen=True)
class Bracket:
    """One run of successive halving: ``n`` configurations starting at ``r`` iterations."""

    s: int
    n: int
    r: Fraction
    rungs: tuple[Rung, ...]
    eta: int
    shards: int = 1

    @property
    def total_configurations(self) -> int:
        return self.n

    @property
    def total_resource_iterations(self) -> Fraction:
        """Sum of ``n_i * r_i``: the paper's budget, as if every rung trained from scratch."""
        return sum((Fraction(g.n_i) * g.r_i for g in self.rungs), Fraction(0))

    @property
    def incremental_resource_iterations(self) -> Fraction:
        """Sum of ``n_i * (r_i - r_{i-1})``: what is trained when promoted configurations resume."""
        return Fraction(self.total_hops, self.shards)

    @property
    def total_hops(self) -> int:
        """Model-hops actually trained (with resume)."""
        return sum(g.n_i * g.new_hops for g in self.rungs)

    def with_shards(self, shards: int) -> "Bracket":
        """The same bracket expressed for another shard count (checked again)."""
        _check_shards(shards)
        return _bracket(self.s, self.n, self.r, self.eta, len(self.rungs), shards, _where="search.adaptive.r")

    def to_dict(self) -> dict[str, Any]:
        return {"s": self.s, "n": self.n, "r": _plain(self.r), "eta": self.eta, "shards": self.shards,
                "total_configurations": self.total_configurations,
                "total_resource_iterations": _plain(self.total_resource_iterations),
                "incremental_resource_iterations": _plain(self.incremental_resource_iterations),
                "total_hops": self.total_hops,
                "rungs": [{"s": g.s, "i": g.i, "n_i": g.n_i, "r_i": _plain(g.r_i), "hops_i": g.hops_i,
                           "new_hops": g.new_hops, "keep": g.keep} for g in self.rungs]}


@dataclass(frozen=True)
class HyperbandPlan:
    """Every bracket of one Hyperband run, from ``s_max`` down to 0 (or to ``skip_last``)."""

    R: int
    eta: int
    rounding: str
    skip_last: int
    brackets: tuple[Bracket, ...]
    shards: int = 1

    @property
    def s_max(self) -> int:
        return s_max(self.R, self.eta)

    @property
    def budget_per_bracket(self) -> int:
        """The paper's ``B = (s_max + 1) * R`` iterations."""
        return (self.s_max + 1) * self.R

    @property
    def total_configurations(self) -> int:
        return sum(b.total_configurations for b in self.brackets)

    @property
    def total_resource_iterations(self) -> Fraction:
        """Sum over brackets and rungs of ``n_i * r_i`` (no resume, the paper's accounting)."""
        return sum((b.total_resource_iterations for b in self.brackets), Fraction(0))

    @property
    def incremental_resource_iterations(self) -> Fraction:
        """Sum of ``n_i * (r_i - r_{i-1})``: the training MOP runs, promoted configurations resuming."""
        return sum((b.incremental_resource_iterations for b in self.brackets), Fraction(0))

    @property
    def total_hops(self) -> int:
        """Model-hops of training with resume: ``incremental_resource_iterations * shards``."""
        return sum(b.total_hops for b in self.brackets)

    def with_shards(self, shards: int) -> "HyperbandPlan":
        """The same plan expressed for another shard count (checked again)."""
        return hyperband_plan(self.R, self.eta, shards=shards, rounding=self.rounding, skip_last=self.skip_last)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able; a fraction of an iteration is written as a string such as ``"4/3"``."""
        return {"R": self.R, "eta": self.eta, "s_max": self.s_max, "rounding": self.rounding,
                "skip_last": self.skip_last, "shards": self.shards,
                "budget_per_bracket": self.budget_per_bracket,
                "total_configurations": self.total_configurations,
                "total_resource_iterations": _plain(self.total_resource_iterations),
                "incremental_resource_iterations": _plain(self.incremental_resource_iterations),
                "total_hops": self.total_hops,
                "brackets": [b.to_dict() for b in self.brackets]}


Plan = Union[HyperbandPlan, Bracket]


def hyperband_plan(R: int, eta: int = 3, *, shards: int = 1, rounding: str = "paper", skip_last: int = 0
                   ) -> HyperbandPlan:
    """Algorithm 1 of Li et al. for a maximum of ``R`` iterations per configuration."""
    _integer("search.adaptive.R", R, 1, "R is the most iterations one configuration may train, e.g. 81")
    _integer("search.adaptive.eta", eta, 2, "eta is the elimination rate; 3 is the paper's choice")
    if rounding not in ROUNDINGS:
        raise SpecError("search.adaptive.rounding", rounding, f"must be one of {list(ROUNDINGS)}",
                        "use 'paper' for Li et al.'s Algorithm 1 or 'madlib' to match Apache MADlib")
    top = s_max(R, eta)
    _integer("search.adaptive.skip_last", skip_last, 0, "use 0 to run every rung")
    if skip_last > top:
        raise SpecError("search.adaptive.skip_last", skip_last,
                        f"must be at most s_max={top} (R={R}, eta={eta}), or no bracket is left",
                        f"use a skip_last between 0 and {top}")
    _check_shards(shards)
    brackets = []
    for s in range(top, skip_last - 1, -1):
        if rounding == "paper":
            n = -(-(top + 1) * eta ** s // (s + 1))
        else:
            n = (top + 1) // (s + 1) * eta ** s
        brackets.append(_bracket(s, n, Fraction(R, eta ** s), eta, s + 1 - skip_last, shards,
                                 _where="search.adaptive.R", _R=R))
    return HyperbandPlan(R=R, eta=eta, rounding=rounding, skip_last=skip_last, brackets=tuple(brackets),
                         shards=shards)


def successive_halving(n: int, r: int | Fraction, eta: int = 3, rungs: int | None = None, *, shards: int = 1
                       ) -> Bracket:
    """One bracket: ``n`` configurations at ``r`` iterations, keeping ``1/eta`` at each rung.

    ``rungs`` defaults to ``floor(log_eta(n)) + 1``, the most that still leave a configuration in
    the last rung; ``r`` is an int or a :class:`fractions.Fraction` of iterations, and every rung must
    end at a whole number of iterations.
    """
    _integer("search.adaptive.n", n, 1, "n is the number of configurations to start with, e.g. 27")
    if isinstance(r, bool) or not isinstance(r, (int, Fraction)) or r <= 0:
        raise SpecError("search.adaptive.r", r, "must be an int or Fraction of iterations > 0",
                        "use e.g. r=1, or Fraction(1, 2) for half an iteration")
    _integer("search.adaptive.eta", eta, 2, "eta is the elimination rate, e.g. 3")
    most = s_max(n, eta) + 1
    if rungs is None:
        rungs = most
    _integer("search.adaptive.rungs", rungs, 1, f"use between 1 and {most} rungs")
    if rungs > most:
        raise SpecError("search.adaptive.rungs", rungs,
                        f"must be at most {most}: n={n} with eta={eta} leaves no configuration after {most} rungs",
                        f"use rungs <= {most}, or start with n >= {eta ** (rungs - 1)} configurations")
    _check_shards(shards)
    return _bracket(rungs - 1, n, Fraction(r), eta, rungs, shards, _where="search.adaptive.r")


def estimate_wall_seconds(plan: Plan, *, shards: int | None = None, seconds_per_hop: float,
                          slots_per_shard: int = 1) -> float:
    """A lower bound on the wall time of ``plan``, in seconds.

    All brackets run at once ("on the diagonal", as MADlib does), so the work is every model-hop
    of the plan (with resume) spread over ``shards * slots_per_shard`` slots, each hop taking
    ``seconds_per_hop``. It is never less than the longest chain: the configuration that reaches
    the last rung trains its hops one after another. It ignores the barrier at each rung (the
    promotion waits for the slowest configuration), idle slots when a rung has fewer
    configurations than slots, and the fixed cost of each Airflow task, so a run takes longer.
    """
    plan = _for_shards(plan, shards)
    if isinstance(seconds_per_hop, bool) or not isinstance(seconds_per_hop, (int, float)) \
            or not 0 < seconds_per_hop < float("inf"):
        raise SpecError("seconds_per_hop", seconds_per_hop, "must be a finite number of seconds > 0",
                        "measure one hop (e.g. with a one-iteration run) and pass its duration")
    _integer("schedule.slots_per_shard", slots_per_shard, 1, "use the number of GPUs per shard worker, e.g. 1")
    brackets = _brackets(plan)
    work = sum(b.total_hops for b in brackets) / (plan.shards * slots_per_shard)
    chain = max(b.rungs[-1].hops_i for b in brackets)
    return float(max(work, chain) * seconds_per_hop)


def format_plan(plan: Plan, *, shards: int | None = None, seconds_per_hop: float | None = None,
                slots_per_shard: int = 1) -> str:
    """The table shown before a run: every rung of every bracket, the totals, the time estimate."""
    plan = _for_shards(plan, shards)
    if isinstance(plan, HyperbandPlan):
        head = (f"Hyperband (Li et al. 2018, Algorithm 1): R={plan.R} iterations, eta={plan.eta}, "
                f"s_max={plan.s_max}, rounding={plan.rounding}, skip_last={plan.skip_last}")
    else:
        head = f"Successive halving: n={plan.n}, r={_plain(plan.r)} iterations, eta={plan.eta}, {len(plan.rungs)} rungs"
    rows = [("bracket", "rung", "configs", "iterations", "hops", "keep")]
    for b in _brackets(plan):
        rows += [(str(g.s), str(g.i), str(g.n_i), str(_plain(g.r_i)), str(g.hops_i), str(g.keep) if g.keep else "-")
                 for g in b.rungs]
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    lines = [head, f"{plan.shards} shard(s): one iteration = {plan.shards} hop(s); iterations and hops are "
                   "per configuration, counted from its start, at the end of the rung", ""]
    lines += ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
    brackets = _brackets(plan)
    total = sum((b.incremental_resource_iterations for b in brackets), Fraction(0))
    scratch = sum((b.total_resource_iterations for b in brackets), Fraction(0))
    lines += ["", f"total configurations: {sum(b.n for b in brackets)}",
              f"total resource: {_plain(total)} iterations = {sum(b.total_hops for b in brackets)} model-hops "
              f"(promoted configurations resume; {_plain(scratch)} iterations if every rung restarted)"]
    if seconds_per_hop is not None:
        seconds = estimate_wall_seconds(plan, seconds_per_hop=seconds_per_hop, slots_per_shard=slots_per_shard)
        lines.append(f"estimated wall time: at least {seconds:,.0f} s ({_clock(seconds)}) on {plan.shards} shard(s) x "
                     f"{slots_per_shard} slot(s) at {seconds_per_hop:g} s per hop (lower bound: ignores rung "
                     "barriers and per-task overhead)")
    return "\n".join(lines)


def _bracket(s: int, n: int, r: Fraction, eta: int, count: int, shards: int, *, _where: str,
             _R: int | None = None) -> Bracket:
    rungs: list[Rung] = []
    previous = 0
    for i in range(count):
        n_i, r_i = n // eta ** i, r * eta ** i
        if r_i.denominator != 1:
            raise _partial_error(s, i, r_i, r, eta, _where, _R)
        hops = int(r_i) * shards
        keep = n_i // eta if i < count - 1 else 0
        rungs.append(Rung(s=s, i=i, n_i=n_i, r_i=r_i, hops_i=hops, keep=keep, new_hops=hops - previous))
        previous = hops
    return Bracket(s=s, n=n, r=r, rungs=tuple(rungs), eta=eta, shards=shards)


def _partial_error(s: int, i: int, r_i: Fraction, r: Fraction, eta: int, where: str, R: int | None) -> SpecError:
    what = f"bracket s={s} rung i={i} trains to r_i={r_i} iterations"
    if R is not None:
        what = f"with R={R}, eta={eta}, {what}"
    rule = (f"{what}, not a whole number of iterations; a rung must end at an iteration boundary so every "
            "configuration has visited every shard equally often before they are ranked")
    if R is not None:
        unit = eta ** s_max(R, eta)
        fix = (f"choose R as a multiple of eta**s_max={unit} (e.g. R in {[k * unit for k in range(1, eta)]}), "
               "so that every rung ends at an iteration boundary, where a block ends and the search decides")
    else:
        fix = "choose a whole number of iterations for r, so that every rung ends at an iteration boundary"
    return SpecError(where, R if R is not None else r, rule, fix)


def _check_shards(shards: int) -> None:
    _integer("schedule.shards", shards, 1, "use the number of shards the training data is split into, e.g. 4")


def _integer(name: str, value: Any, minimum: int, fix: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(name, value, f"must be an integer >= {minimum}", fix)


def _for_shards(plan: Plan, shards: int | None) -> Plan:
    if not isinstance(plan, (HyperbandPlan, Bracket)):
        raise SpecError("plan", plan, "must be a HyperbandPlan or a Bracket",
                        "build one with hyperband_plan() or successive_halving()")
    return plan if shards is None or shards == plan.shards else plan.with_shards(shards)


def _brackets(plan: Plan) -> tuple[Bracket, ...]:
    return plan.brackets if isinstance(plan, HyperbandPlan) else (plan,)


def _plain(value: Fraction) -> int | str:
    """An int when whole, else the exact fraction as text ("4/3")."""
    return int(value) if value.denominator == 1 else str(value)


def _clock(seconds: float) -> str:
    minutes, sec = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {sec:02d}s" if hours else f"{minutes}m {sec:02d}s"
