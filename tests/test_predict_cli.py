"""`mop-airflow predict` and `mop-airflow export-best` as a user runs them, and the predict operator in a DAG.

One tiny run (digits, 64 scalar columns, one configuration) made once with dag.test(); the
commands find it with --store alone, without Airflow.
"""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from mop_airflow.cli.main import OK, UNAVAILABLE, USAGE, main
from mop_airflow.records.layout import RunLayout
from mop_airflow.store import Store
from tests.conftest import write_dag_file
from tests.test_end_to_end import MLP, write_digits

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def run(airflow_db, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("predict_cli")
    source = tmp / "digits.parquet"
    write_digits(source)
    root = f"file://{tmp / 'store'}"
    spec = {"data": {"source": str(source), "label": "digit", "features": "px*", "classes": list(range(10)),
                     "validation": 0.2},
            "search": {"space": {"method": "grid", "params": {"model": [MLP], "learning_rate": [1e-2],
                                                              "batch_size": [64], "hparams": {"units": [16]}}},
                       "metric": "val_accuracy"},
            "schedule": {"shards": 2, "iterations": 1, "seed": 5}, "store": {"root": root}}
    dag_run = write_dag_file("mop_predict_cli", spec).test()
    assert dag_run.state == "success"
    return tmp, source, RunLayout(Store(root), "mop_predict_cli", dag_run.run_id)


def _expected(tmp, source, layout):
    import keras

    model = keras.models.load_model(layout.store.local_path(layout.report_uri("best_model.keras")))
    x = pq.read_table(source).drop(["digit"]).to_pandas().to_numpy("float32")
    return x, model.predict(x, verbose=0)


def test_predict_with_only_the_store_writes_each_mode(run, capsys):
    tmp, source, layout = run
    store = str(tmp / "store")  # a plain folder: no Airflow is asked
    _, expected = _expected(tmp, source, layout)
    assert main(["predict", "mop_predict_cli", layout.run_id, "--store", store, "--source", str(source),
                 "--out", str(tmp / "response.parquet")]) == OK
    printed = capsys.readouterr().out
    assert "1797 row(s) scored (response: row_id, response) with configuration" in printed
    assert f"written: file://{tmp / 'response.parquet'}" in printed
    table = pq.read_table(tmp / "response.parquet")
    assert table["row_id"].to_pylist() == list(range(1797))
    assert table["response"].to_pylist() == expected.argmax(axis=1).tolist()

    # without RUN_ID: the DAG's latest reported run
    assert main(["predict", "mop_predict_cli", "--store", store, "--source", str(source), "--out",
                 str(tmp / "top.parquet"), "--mode", "top_k", "--k", "2", "--batch-rows", "500"]) == OK
    table = pq.read_table(tmp / "top.parquet")
    top = np.argsort(-expected, axis=1, kind="stable")[:, :2]
    assert table.num_rows == 2 * 1797 and table["class"].to_pylist() == top.reshape(-1).tolist()
    np.testing.assert_allclose(table["prob"].to_numpy(), np.take_along_axis(expected, top, 1).reshape(-1),
                               rtol=1e-5, atol=1e-6)


def test_predict_exit_codes_name_the_problem(run, capsys):
    tmp, source, layout = run
    store = str(tmp / "store")
    table = pq.read_table(source)
    pq.write_table(table.drop(["px7"]), tmp / "missing.parquet")
    args = ["predict", "mop_predict_cli", layout.run_id, "--store", store, "--out", str(tmp / "x.parquet")]
    assert main([*args, "--source", str(tmp / "missing.parquet")]) == USAGE
    err = capsys.readouterr().err
    assert "column 'px7' is missing" in err and "the model's input 'features' was trained on it" in err
    assert main([*args, "--source", str(source), "--mode", "top_k", "--k", "12"]) == USAGE
    assert "--k=12: must be between 1 and the run's 10 classes. Fix: pass --k 3" in capsys.readouterr().err
    assert main([*args, "--source", str(source), "--k", "0"]) == USAGE
    assert main(["predict", "mop_predict_cli", "no_such_run", "--store", store, "--source", str(source),
                 "--out", str(tmp / "x.parquet")]) == UNAVAILABLE
    assert "no run 'no_such_run' of DAG 'mop_predict_cli'" in capsys.readouterr().err
    assert main([*args, "--source", str(tmp / "nothing_here")]) == USAGE
    assert not (tmp / "x.parquet").exists()


def test_export_best_writes_the_model_a_saved_model_and_its_card(run, capsys):
    import tensorflow as tf

    tmp, source, layout = run
    out = tmp / "serving"
    assert main(["export-best", "mop_predict_cli", layout.run_id, "--store", str(tmp / "store"), "--out", str(out),
                 "--format", "saved_model"]) == OK
    assert f"written: file://{out / 'model_card.json'}" in capsys.readouterr().out
    x, expected = _expected(tmp, source, layout)
    served = tf.saved_model.load(str(out / "saved_model"))  # held: its functions reference its variables
    np.testing.assert_allclose(served.serve(tf.constant(x[:50])).numpy(), expected[:50], rtol=1e-5, atol=1e-6)
    card = json.loads((out / "model_card.json").read_text())
    assert set(card) >= {"configuration", "metrics", "data", "versions", "ranked_on", "output", "training"}
    assert card["data"]["features"] == [f"px{i}" for i in range(64)] and card["data"]["fingerprint"]
    assert card["configuration"]["optimizer_params"]["learning_rate"] == 1e-2
    with pytest.raises(SystemExit) as refused:  # argparse refuses it with its usage line
        main(["export-best", "mop_predict_cli", layout.run_id, "--store", str(tmp / "store"), "--out", str(tmp / "k"),
              "--format", "onnx"])
    assert refused.value.code == USAGE


def test_predict_operator_scores_in_a_dag_and_returns_the_uri(run, session_dir):
    tmp, source, layout = run
    folder = session_dir / "dags"
    path = folder / "mop_predict_operator.py"
    out = tmp / "from_operator.parquet"
    path.write_text(
        "import pendulum\nfrom airflow.sdk import DAG\nfrom mop_airflow.operators.predict import MopPredictOperator\n"
        "with DAG('mop_predict_operator', schedule=None, start_date=pendulum.datetime(2026, 1, 1)) as dag:\n"
        f"    MopPredictOperator(task_id='score', source={str(source)!r}, out={str(out)!r}, mode='prob',\n"
        f"                       model_dag_id='mop_predict_cli', store={{'root': {layout.store.root!r}}})\n")
    import importlib.util

    spec = importlib.util.spec_from_file_location("dagfile_mop_predict_operator", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag_run = module.dag.test()
    assert dag_run.state == "success"
    assert dag_run.get_task_instance("score").xcom_pull(task_ids="score") == f"file://{out}"
    _, expected = _expected(tmp, source, layout)
    table = pq.read_table(out)
    np.testing.assert_allclose(np.stack([table[f"prob_{c}"].to_numpy() for c in range(10)], 1), expected,
                               rtol=1e-5, atol=1e-6)
