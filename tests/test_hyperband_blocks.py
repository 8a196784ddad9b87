"""Hyperband decided between blocks of hops, one block a DAG run, against the same search drawn into
one DAG run, on a real Airflow: the same rung decisions and the same leaderboard.

R=3, eta=3 on 2 shards: bracket 1 trains 3 configurations for 1 iteration and promotes the best to
3; bracket 0 trains 2 for 3 iterations. Drawn into one run (``between_runs: false``) the rungs are
task groups with promote tasks; decided between blocks (``between_runs: true``) the search takes
three runs of one iteration each, and the same seeded deal places every rung's configurations on
the same shards in the same order, so they train the same models.
"""

import pytest

from mop_airflow.airflow.local import LocalAirflow
from mop_airflow.records import BlockDecision, RungDecision
from mop_airflow.records.layout import RunLayout
from mop_airflow.store import Store
from tests.conftest import dag_file, failed_logs
from tests.test_end_to_end import MLP, tiny_spec, write_digits

pytestmark = pytest.mark.integration

DRAWN, BLOCKS = "mop_hb_drawn", "mop_hb_blocks"


def hyperband(source, root, between_runs):
    spec = tiny_spec(source, root)
    spec["search"]["space"] = {"method": "random", "seed": 3, "params": {
        "model": [MLP], "learning_rate": {"distribution": "log_uniform", "low": 1e-4, "high": 3e-2},
        "batch_size": [32], "hparams": {"units": {"distribution": "choice", "values": [16, 32]}}}}
    spec["search"]["adaptive"] = {"method": "hyperband", "R": 3, "eta": 3, "between_runs": between_runs}
    if between_runs:
        spec["schedule"]["iterations_per_run"] = 1  # a DAG run a block, as a search too large for one run goes
    return spec


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    root = tmp_path_factory.mktemp("hb_blocks")
    dags = root / "dags"
    dags.mkdir()
    write_digits(root / "digits.parquet")
    for dag_id, between in ((DRAWN, False), (BLOCKS, True)):
        dag_file(dags, dag_id, hyperband(root / "digits.parquet", f"file://{root / 'store'}", between))
    with LocalAirflow(root / "airflow", dags, extra_env={"MOP_AIRFLOW_HOME": str(root / "mop")}) as af:
        for dag_id in (DRAWN, BLOCKS):
            af.wait_for_dag(dag_id)
        af.root = root
        yield af


@pytest.mark.slow
def test_hyperband_between_runs_decides_and_ranks_as_the_search_drawn_into_one_run(airflow):
    store = Store(f"file://{airflow.root / 'store'}")
    drawn = airflow.trigger(DRAWN)
    first = airflow.trigger(BLOCKS)
    assert airflow.wait_for_run(DRAWN, drawn, timeout=420) == "success", failed_logs(airflow, DRAWN, drawn)
    runs = [first, f"{first}__block_1", f"{first}__block_2"]
    for run_id in runs:
        assert airflow.wait_for_run(BLOCKS, run_id, timeout=420) == "success", failed_logs(airflow, BLOCKS, run_id)
    assert "decide" not in {ti["task_id"] for ti in airflow.task_instances(DRAWN, drawn)}
    one, split = RunLayout(store, DRAWN, drawn), RunLayout(store, BLOCKS, first)

    # the same rung decision: bracket 1's best of three goes on, ranked on the same metric
    (decision,) = [RungDecision.read(store, uri) for uri in store.glob(one.rung_decision_uri("*", "*"))]
    blocks = [BlockDecision.read(store, split.block_decision_uri(b)) for b in range(4)]
    assert blocks[3].finished and not blocks[2].finished
    promotions = [j for b in blocks for j in b.jobs if j["kind"] == "promote"]
    assert [(j["config_id"], j["bracket"], j["rung"]) for j in promotions] == [(decision.promoted[0], 1, 1)]
    drawn_metric = {r["config_id"]: r["metric"] for r in decision.results}
    assert promotions[0]["metric"] == pytest.approx(drawn_metric[decision.promoted[0]], abs=1e-6)
    assert [len(b.training) for b in blocks] == [5, 3, 3, 0]  # 3 + 2 start; then the promoted one and bracket 0

    # the same leaderboard, configuration by configuration
    board_one = store.read_json(one.report_uri("leaderboard.json"))["leaderboard"]
    board_split = store.read_json(split.report_uri("leaderboard.json"))["leaderboard"]
    assert [(r["config_id"], r["status"]) for r in board_split] == [(r["config_id"], r["status"]) for r in board_one]
    for a, b in zip(board_split, board_one):
        assert a["val_accuracy"] == pytest.approx(b["val_accuracy"], abs=1e-6), a["config_id"]
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5), a["config_id"]
    pruned = [r for r in board_split if r["status"] == "pruned"]
    assert len(pruned) == 2 and all(r["outcome"].startswith("stopped at rung 0 of bracket 1 (1 iteration(s))")
                                    for r in pruned)
