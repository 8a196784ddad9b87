"""Example: a folder of image files — a 2-D CNN against an MLP on scikit-learn's digits as PNG files.

The data comes from `mop-airflow example-data`: ``digit_images/<digit>/<i>.png``, one folder per
class as Keras's ``image_dataset_from_directory`` reads them. Each file is a row: ``image`` (its
bytes, decoded on the worker as 8x8 grayscale), ``label`` (its folder's name) and ``path``. The
classes are found in the folder names ("0" to "9"); the builders rescale the pixels to 0-1.
"""

from mop_airflow import build_mop_dag
from mop_airflow.examples.sklearn_data import digit_images_data_spec, digits_search

spec = {
    "data": digit_images_data_spec(),
    "search": digits_search(rescale=[1 / 255]),
    "schedule": {"shards": 2, "iterations": 3, "epochs_per_hop": 1, "seed": 7},
}

dag = build_mop_dag(spec, dag_id="mop_digit_images", tags=["mop_airflow", "example"], doc_md=__doc__)
