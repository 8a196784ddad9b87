"""Pure decisions before and between hops: resolve the run once, deal and bundle its configurations,
place hops on shards, render the task plan, split a search over DAG runs, decide rungs, simulate.
No Airflow, no TensorFlow."""
