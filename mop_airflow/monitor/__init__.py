"""Following a run from outside Airflow, through its REST API: run_status.py (what Airflow knows
about a MOP run: the run and its selections, busy shards, failed tasks, what it waits for) and
watch.py (the terminal's view of ``mop-airflow status`` and the demo). The results page reads what a
run waits for from here too."""
