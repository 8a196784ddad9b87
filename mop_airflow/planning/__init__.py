"""Pure decisions before and between hops: resolve the run once, deal its configurations into offset
classes and line them up, place hops on shards, render the task plan, split a search over DAG runs, decide rungs, simulate.
No Airflow, no TensorFlow."""
