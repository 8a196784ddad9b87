"""Example data sets from scikit-learn's bundled data, written the way real data sets are stored.

- ``digits/``: the 1,797 8x8 handwritten digits as a tensor column ``pixels`` (a fixed-size list of
  64 float32 in [0, 1], declared with shape ``[8, 8, 1]``) and ``label``, in four Parquet files;
- ``digit_images/``: the same digits as 8x8 grayscale PNG files, one folder per class
  (``digit_images/<digit>/<i>.png``): the layout of Keras's ``image_dataset_from_directory``;
- ``friedman/``: Friedman's regression problem #1 (``make_friedman1``, 4,000 rows, ``x0..x9`` and a
  numeric ``y``) as four CSV files.

Nothing is downloaded: both come with scikit-learn.
"""

from __future__ import annotations

import os

import numpy as np

DIGITS = "digits"
DIGIT_IMAGES = "digit_images"
FRIEDMAN = "friedman"
PARTS = 4


def write_digits(directory: str) -> str:
    """Write ``<directory>/digits/part-<i>.parquet``; returns the folder."""
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415
    from sklearn.datasets import load_digits  # noqa: PLC0415

    x, y = load_digits(return_X_y=True)
    folder = os.path.join(os.path.abspath(os.path.expanduser(directory)), DIGITS)
    os.makedirs(folder, exist_ok=True)
    for part, rows in enumerate(np.array_split(np.arange(len(y)), PARTS)):
        pixels = pa.FixedSizeListArray.from_arrays(pa.array((x[rows] / 16.0).astype(np.float32).reshape(-1)), 64)
        _write_atomic(os.path.join(folder, f"part-{part}.parquet"),
                      lambda path, t=pa.table({"pixels": pixels, "label": y[rows].astype(np.int64)}):
                      pq.write_table(t, path))
    return folder


def write_digit_images(directory: str) -> str:
    """Write ``<directory>/digit_images/<digit>/<i>.png`` (8x8, grayscale 0-255); returns the folder."""
    import io  # noqa: PLC0415

    from PIL import Image  # noqa: PLC0415
    from sklearn.datasets import load_digits  # noqa: PLC0415

    x, y = load_digits(return_X_y=True)
    folder = os.path.join(os.path.abspath(os.path.expanduser(directory)), DIGIT_IMAGES)
    pixels = np.clip(x * 16, 0, 255).astype(np.uint8).reshape(-1, 8, 8)  # 0-16 in the data set
    for i, (image, digit) in enumerate(zip(pixels, y)):
        os.makedirs(os.path.join(folder, str(digit)), exist_ok=True)
        buffer = io.BytesIO()
        Image.fromarray(image, "L").save(buffer, format="PNG")
        _write_atomic(os.path.join(folder, str(digit), f"{i:04d}.png"),
                      lambda path, data=buffer.getvalue(): open(path, "wb").write(data))
    return folder


def write_friedman(directory: str, rows: int = 4000, seed: int = 0) -> str:
    """Write ``<directory>/friedman/part-<i>.csv``; returns the folder."""
    from sklearn.datasets import make_friedman1  # noqa: PLC0415

    x, y = make_friedman1(n_samples=rows, n_features=10, noise=1.0, random_state=seed)
    folder = os.path.join(os.path.abspath(os.path.expanduser(directory)), FRIEDMAN)
    os.makedirs(folder, exist_ok=True)
    header = ",".join([*(f"x{i}" for i in range(x.shape[1])), "y"])
    for part, chunk in enumerate(np.array_split(np.arange(rows), PARTS)):
        lines = [header] + [",".join(f"{v:.6f}" for v in (*x[i], y[i])) for i in chunk]
        _write_atomic(os.path.join(folder, f"part-{part}.csv"),
                      lambda path, text="\n".join(lines) + "\n": open(path, "w").write(text))
    return folder


def digits_data_spec(directory: str | None = None) -> dict:
    """The digits folder as 8x8x1 images from a tensor column; classes are found by validation."""
    return {"source": os.path.join(_data_dir(directory), DIGITS), "label": "label", "validation": 0.2,
            "features": {"pixels": {"shape": [8, 8, 1]}}}


def digit_images_data_spec(directory: str | None = None) -> dict:
    """The digit PNG folders: the label is the class folder's name; the models rescale 0-255 to 0-1."""
    return {"source": os.path.join(_data_dir(directory), DIGIT_IMAGES), "label": "label", "validation": 0.2,
            "features": {"image": {"shape": [8, 8, 1], "decode": "image", "color_mode": "grayscale"}}}


def friedman_data_spec(directory: str | None = None) -> dict:
    """The Friedman #1 CSV folder as a regression target."""
    return {"source": os.path.join(_data_dir(directory), FRIEDMAN), "label": "y", "features": "x*",
            "task": "regression", "validation": 0.2}


def digits_search(**hparams: list) -> dict:
    """The search section the digits examples share: a 2-D CNN against an MLP, two learning rates,
    ranked on validation accuracy (``hparams`` adds builder hyperparameters, e.g. ``rescale``)."""
    params = {"model": ["mop_airflow.examples.image_models:cnn2d", "mop_airflow.examples.image_models:flat_mlp"],
              "optimizer": "adam", "learning_rate": [3e-3, 1e-2], "batch_size": [32], "metrics": ["accuracy"]}
    if hparams:
        params["hparams"] = dict(hparams)
    return {"space": {"method": "grid", "params": params}, "metric": "val_accuracy"}


def _data_dir(directory: str | None) -> str:
    from mop_airflow.config import default_home  # noqa: PLC0415

    return directory or os.path.join(default_home(), "data")


def _write_atomic(path: str, write) -> None:
    """Readers (and the shard fingerprint, which looks at sizes and mtimes) never see a partial file."""
    tmp = f"{path}.tmp-{os.getpid()}"
    write(tmp)
    os.replace(tmp, path)
