"""A MOP DAG's description: what its search does, in a line, from the spec and its shape.

Airflow shows it in the DAG list and the DAG's page. Imports no Airflow.
"""

from __future__ import annotations

from typing import Any

from mop_airflow.config.form import rung_iterations
from mop_airflow.planning.shape import DagShape
from mop_airflow.search.adaptive import brackets_of, decision_points
from mop_airflow.search.asha import AshaPlan
from mop_airflow.search.pbt import PbtPlan


def describe_search(spec: Any, shape: DagShape) -> str:
    """What the DAG does, with how many blocks one run holds where a search is decided between blocks."""
    text = _what(spec, shape)
    if shape.adaptive is not None and not shape.in_slots and (shape.blocks > 1 or shape.whole):
        held = f"all {shape.blocks} in one DAG run" if shape.whole else f"{shape.blocks} blocks a DAG run"
        return text.replace("one block a DAG run", held)
    return text


def _what(spec: Any, shape: DagShape) -> str:
    p, schedule, space, adaptive = shape.shards, spec.schedule, spec.search.space, shape.adaptive
    if adaptive is None:
        return (f"{space.method.capitalize()} search, {shape.configurations} configurations by default; models hop "
                f"across {p} shards for {schedule.iterations} iteration(s) of {schedule.epochs_per_hop} epoch(s) per hop")
    if space.sampler == "tpe" and spec.search.adaptive is None:
        return (f"Model-based random search (TPE): {space.num_samples} configurations, the first "
                f"{min(space.startup, space.num_samples)} drawn at random, each later one proposed from the results; "
                f"each trains {schedule.iterations} iteration(s), decided between blocks (a wave each), one block a "
                f"DAG run; models hop across {p} shards")
    if isinstance(adaptive, AshaPlan):
        how = (f"decided between blocks, each ending where one of its jobs ends; TPE proposes the configurations "
               f"after the first {space.startup}" if space.sampler == "tpe" else
               "decided inside the shard slots, one block in one DAG run")
        return (f"ASHA n={adaptive.n}, r={adaptive.r}, R={adaptive.R}, eta={adaptive.eta}: rungs at "
                f"{', '.join(map(str, adaptive.rungs))} iteration(s), {how}; models hop across {p} shards")
    if isinstance(adaptive, PbtPlan):
        return (f"Population-based training: {adaptive.population} members for {adaptive.iterations} iteration(s); "
                f"every {adaptive.interval} the bottom {adaptive.in_quantile()} copy the top {adaptive.in_quantile()} "
                f"and explore {', '.join(sorted(adaptive.mutations))}, one block per interval in one DAG run; "
                f"models hop across {p} shards")
    brackets = brackets_of(adaptive)
    eta = brackets[0].eta
    named = (f"Hyperband R={adaptive.R}, eta={eta}" if spec.search.adaptive["method"] == "hyperband"
             else f"Successive halving n={brackets[0].n}, r={brackets[0].r}, eta={eta}")
    named += f", one block per rung end ({', '.join(map(str, decision_points(adaptive)))}) in one DAG run"
    return (f"{named}: "
            f"{adaptive.total_configurations} configurations in {len(brackets)} bracket(s), trained "
            f"{' or '.join(', '.join(rung_iterations(adaptive)).rsplit(', ', 1))} iteration(s) (each rung keeps "
            f"the best 1/{eta}); models hop across {p} shards")
