"""A streamed hop: windows of row groups, same weights as plain Keras fed the same batches."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mop_airflow.training.builder import build_model
from mop_airflow.training.hop import train_streamed
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
