"""A streamed hop: windows of row groups, same weights as plain Keras fed the same batches."""

from __future__ import annotations

import numpy as np
import pytest
import pyarrow as pa
import pyarrow.parquet as pq

from mop_airflow.training.builder import build_model
from mop_airflow.training.hop import train_streamed
from mop_airflow.training.model_hop import run_hop
from mop_airflow.training.stream import stream_batches, stream_order, stream_windows
from tests.training.test_hop import BATCH, SEED, same_variables
from tests.training.toys import make_config

ROW_GROUP = 10
WINDOW = 25


def write_shard(path, x: np.ndarray, y: np.ndarray) -> str:
    """One Parquet file in row groups of 10 rows; ``row`` numbers the rows."""
    table = pa.table({"row": np.arange(len(y)), **{f"x{i}": x[:, i] for i in range(x.shape[1])}, "label": y})
    pq.write_table(table, str(path), row_group_size=ROW_GROUP)
    return str(path)


def loader(table):
    x = np.stack([table[f"x{i}"].to_numpy() for i in range(6)], axis=1).astype(np.float32)
    return x, table["label"].to_numpy().astype(np.int32)


def test_windows_cover_every_row_group_once_in_a_seeded_order():
    sizes = [10] * 9 + [7]
    windows = stream_windows(sizes, 25, seed=1, iteration=0, shard=2, epoch=0)
    assert sorted(g for groups, _ in windows for g in groups) == list(range(10))
    assert all(sum(sizes[g] for g in groups) >= 25 for groups, _ in windows[:-1])
    order = stream_order(sizes, 25, seed=1, iteration=0, shard=2, epoch=0)
    assert sorted(order.tolist()) == list(range(97))
    assert not np.array_equal(order, stream_order(sizes, 25, seed=1, iteration=0, shard=2, epoch=1))
    assert np.array_equal(order, stream_order(sizes, 25, seed=1, iteration=0, shard=2, epoch=0))


def test_stream_batches_follow_stream_order_and_carry_rows_across_windows(tmp_path, toy_data):
    x, y = toy_data
    path = write_shard(tmp_path / "shard.parquet", x, y)
    seeds = {"seed": 3, "iteration": 1, "shard": 0, "epoch": 0}

    def rows_of(table):
        return table["row"].to_numpy(), table["label"].to_numpy()

    batches = list(stream_batches(path, rows_of, batch_size=BATCH, window_rows=WINDOW, **seeds))
    assert [len(b[1]) for b in batches] == [BATCH] * 12 + [4]  # 100 rows: full batches, then the rest
    streamed = np.concatenate([rows for rows, _ in batches])
    assert np.array_equal(streamed, stream_order([ROW_GROUP] * 10, WINDOW, **seeds))


@pytest.mark.parametrize("batch", [1, 7, 25, 26, 40, 99, 100, 150])
def test_batches_of_any_size_against_windows_follow_stream_order(tmp_path, toy_data, batch):
    """Batches smaller than, equal to and larger than a window (a carried batch may span windows)."""
    x, y = toy_data
    path = write_shard(tmp_path / "shard.parquet", x, y)
    seeds = {"seed": 5, "iteration": 2, "shard": 1, "epoch": 3}

    batches = list(stream_batches(path, lambda t: (t["row"].to_numpy(), t["label"].to_numpy()), batch_size=batch,
                                  window_rows=WINDOW, **seeds))
    full, rest = divmod(100, batch)
    assert [len(rows) for rows, _ in batches] == [batch] * full + ([rest] if rest else [])
    order = stream_order([ROW_GROUP] * 10, WINDOW, **seeds)
    assert np.array_equal(np.concatenate([rows for rows, _ in batches]), order)
    assert np.array_equal(np.concatenate([labels for _, labels in batches]), y[order])


def test_a_streamed_hop_gives_the_weights_of_keras_fed_the_same_batches(tmp_path, toy_data):
    x, y = toy_data
    path = write_shard(tmp_path / "shard.parquet", x, y)
    config = make_config(epochs_per_hop=2)
    shapes = {"features": (6,)}

    streamed = build_model(config, input_shapes=shapes, num_classes=3, seed=SEED)
    summary = train_streamed(streamed, path, loader, batch_size=BATCH, epochs=2, seed=SEED, iteration=0, shard=1,
                             window_rows=WINDOW)
    assert summary["steps"] == 2 * 13 and summary["samples"] == 200

    reference = build_model(config, input_shapes=shapes, num_classes=3, seed=SEED)
    for epoch in range(2):
        order = stream_order([ROW_GROUP] * 10, WINDOW, seed=SEED, iteration=0, shard=1, epoch=epoch)
        for start in range(0, len(order), BATCH):
            rows = order[start:start + BATCH]
            reference.train_on_batch(x[rows], y[rows])
    assert same_variables(streamed, reference)


def test_streamed_evaluation_equals_evaluation_in_memory(tmp_path, toy_data):
    from mop_airflow.training.hop import evaluate, evaluate_streamed

    x, y = toy_data
    path = write_shard(tmp_path / "validation.parquet", x, y)
    model = build_model(make_config(), input_shapes={"features": (6,)}, num_classes=3, seed=SEED)
    in_memory = evaluate(model, x, y, batch_size=16)
    streamed = evaluate_streamed(model, path, loader, batch_size=16, window_rows=WINDOW)
    assert set(streamed) == {"val_loss", "val_accuracy"}
    for name, value in in_memory.items():
        assert abs(streamed[name] - value) < 1e-5, name


def test_a_hop_over_a_shard_larger_than_its_window_reads_it_window_by_window(tmp_path, monkeypatch):
    """run_hop streams a shard of many row groups: each read decodes one window of the stated rows."""
    from mop_airflow.data.decoded import DecodedShard, is_decoded
    from mop_airflow.data.shard import shard_dataset
    from mop_airflow.planning.resolve import resolve_run
    from mop_airflow.records import Assignment
    from mop_airflow.records.layout import RunLayout
    from mop_airflow.store import Store
    from mop_airflow.training import model_hop
    from tests.training.toys import TOY_MODEL

    rng = np.random.default_rng(1)
    source = tmp_path / "source"
    source.mkdir()
    for k in range(6):  # each file is a record batch of the sharding, so each shard gets 6 row groups
        x = rng.normal(size=(300, 6)).astype("float32")
        pq.write_table(pa.table({**{f"f{i}": x[:, i] for i in range(6)}, "y": (x[:, 0] > 0).astype("int64")}),
                       source / f"part-{k}.parquet")
    spec = {
        "data": {"source": str(source), "label": "y", "features": "f*", "classes": [0, 1], "validation": 0.2},
        "search": {"space": {"method": "grid", "params": {"model": [TOY_MODEL], "batch_size": [16]}}},
        "schedule": {"shards": 2, "iterations": 2, "seed": 3},
        "store": {"root": f"file://{tmp_path / 'store'}", "cache_dir": str(tmp_path / "cache")},
    }
    run = resolve_run(spec, None, dag_id="d", run_id="r")
    layout = RunLayout(Store(run.store.root), "d", "r")
    manifest = shard_dataset(run.data, layout.store, "d", 2, run.schedule.seed)
    entry = manifest.shards[0]
    window = 250  # rows: the share of data.batch_mb that makes it so
    monkeypatch.setattr(model_hop, "WINDOW_SHARE", window * entry.bytes / entry.rows / (run.data.batch_mb * 1e6))
    monkeypatch.setattr(model_hop, "STREAM_ABOVE_BATCHES", 0)  # every shard streams
    assert model_hop.window_rows(entry, run, 16) == window

    # Float features are cached decoded: a window reads its row groups' rows, and only those.
    gathered = []
    real_read = DecodedShard.read

    def read(self, groups):
        x, y = real_read(self, groups)
        gathered.append(len(y))
        return x, y
    monkeypatch.setattr(DecodedShard, "read", read)
    cid = run.configs[0]["config_id"]
    record, _ = run_hop(layout, run, manifest, Assignment(cid, -1, None), t=0, shard=0,
                        cache_dir=run.store.local_cache)

    cached = [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(entry.sha256)]
    assert len(cached) == 1 and is_decoded(str(cached[0]))  # no Parquet copy beside the arrays
    groups = DecodedShard.open(str(cached[0])).group_rows
    assert len(groups) == 6 and max(groups) < window
    expected = [sum(groups[g] for g in chosen)
                for chosen, _ in stream_windows(groups, window, seed=model_hop.config_seed(run.schedule.seed, cid),
                                                iteration=0, shard=0, epoch=0)]
    assert gathered == expected and len(gathered) > 1  # one read per window, of the windows' rows
    assert all(window <= rows < window + max(groups) for rows in gathered[:-1])  # whole row groups, >= the window
    assert sum(gathered) == entry.rows == record.train_metrics["samples"]


def test_a_streamed_parquet_shard_is_decoded_window_by_window(tmp_path):
    """Rows not cached decoded (images, narrow tensors) stream from the Parquet file: one decode per window."""
    path = str(tmp_path / "shard.parquet")
    rng = np.random.default_rng(2)
    with pq.ParquetWriter(path, pa.schema([("f0", pa.float32()), ("y", pa.int64())])) as writer:
        for _ in range(6):
            writer.write_table(pa.table({"f0": rng.normal(size=90).astype("float32"), "y": rng.integers(0, 2, 90)}))
    decoded = []

    def load(table):
        decoded.append(table.num_rows)
        return table["f0"].to_numpy().reshape(-1, 1), table["y"].to_numpy()
    batches = list(stream_batches(path, load, batch_size=16, window_rows=200, seed=1, iteration=0, shard=0, epoch=0))
    assert decoded == [270, 270]  # windows of whole row groups of 90 rows, at least 200 rows each
    assert sum(len(b[1]) for b in batches) == 540
