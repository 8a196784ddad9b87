"""Make the example project's data: scikit-learn's bundled digits as one Parquet file.

1,797 handwritten digits of 8x8 pixels, shipped inside scikit-learn (nothing is downloaded), written
as 64 feature columns ``px0`` .. ``px63`` scaled to [0, 1] and a label column ``digit``. Replace this
script with whatever writes your own data: the DAG only needs a Parquet (or CSV) file, folder or
prefix with a label column and numeric feature columns.

    python make_data.py                     # writes data/digits.parquet beside this file
    python make_data.py --out /data/train.parquet
"""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent / "data" / "digits.parquet"


def make_digits(out: Path = DEFAULT_OUT) -> Path:
    """Write the digits to ``out`` (its folder made if missing) and return the path."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    columns = {f"px{i}": (x[:, i] / 16.0).astype("float32") for i in range(x.shape[1])}
    columns["digit"] = y.astype("int64")
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write scikit-learn's bundled digits as a Parquet file.")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"the file to write (default: {DEFAULT_OUT})")
    path = make_digits(parser.parse_args(argv).out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
