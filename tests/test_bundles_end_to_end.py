"""Bundle sizes 1, 2 and auto through Airflow (dag.test): the same per-configuration metrics under the
same visit orders, from the same train tasks (one per shard slot, whatever the bundles)."""

import pytest

from mop_airflow.records.layout import RunLayout
from mop_airflow.store import Store
from tests.conftest import write_dag_file
from tests.test_end_to_end import tiny_spec, write_digits

pytestmark = pytest.mark.integration


def test_bundle_sizes_give_the_same_metrics_per_configuration(airflow_db, tmp_path):
    source = tmp_path / "digits.parquet"
    write_digits(source)
    root = f"file://{tmp_path / 'store'}"
    store = Store(root)
    results = {}
    for size in (1, 2, "auto"):
        spec = tiny_spec(source, root, bundle_size=size)
        spec["search"]["space"]["params"]["learning_rate"] = [1e-4, 3e-3, 1e-2, 3e-2]  # 2 per offset class
        dag_id = f"mop_bundles_{size}"
        run = write_dag_file(dag_id, spec).test()
        assert run.state == "success"
        layout = RunLayout(store, dag_id, run.run_id)
        plan = store.read_json(layout.plan_uri)
        hops = [store.read_json(u) for u in store.glob(layout.hops_glob)]
        tis = [ti for ti in run.get_task_instances() if ti.task_id.startswith("train_shard_")]
        results[size] = {
            "classes": plan["classes"], "visit_order": plan["visit_order"], "bundles": plan["bundles"],
            "board": [(r["config_id"], r["val_accuracy"], r["val_loss"], r.get("train_loss"))
                      for r in store.read_json(layout.report_uri("leaderboard.json"))["leaderboard"]],
            "metrics": sorted((m["config_id"], m["iteration"], m["train_loss"], m["val_loss"])
                              for m in store.read_json(layout.report_uri("metrics.json"))),
            "task_instances": len(tis), "states": {ti.state for ti in tis},
            "reused": sum(h["model_reused"] for h in hops), "hops": len(hops), "layout": layout,
        }
    one, two, auto = results[1], results[2], results["auto"]
    for other in (two, auto):
        assert other["classes"] == one["classes"] and other["visit_order"] == one["visit_order"]
        assert other["board"] == one["board"]  # exactly: same ranking, same numbers
        assert other["metrics"] == one["metrics"]
    assert one["hops"] == two["hops"] == auto["hops"] == 4 * 4  # 4 configurations x 2 iterations x 2 shards
    # the bundles differ; the train tasks do not: one per shard, each trained by a warm process
    assert [len(b) for per in one["bundles"] for b in per] == [1, 1, 1, 1]
    assert [len(b) for per in two["bundles"] for b in per] == [2, 2] and auto["bundles"] == two["bundles"]
    assert one["task_instances"] == two["task_instances"] == auto["task_instances"] == 2
    # dag.test() runs one task at a time: the block's first train task trains every hop, building the one
    # model once and reusing it for the other 15 hops
    assert one["reused"] == two["reused"] == auto["reused"] == 15
    assert {s for r in results.values() for s in r["states"]} == {"success"}

    # the results page says which configurations share a bundle
    from mop_airflow.records import RunRecord
    from mop_airflow.results.page import run_results

    layout = auto["layout"]
    page = run_results(layout, RunRecord.read(store, layout.run_record_uri))
    assert page["plan"]["bundles"] == [b for per in auto["bundles"] for b in per]
    for config in page["configs"]:
        assert config["config_id"] in page["plan"]["bundles"][config["bundle"]]
