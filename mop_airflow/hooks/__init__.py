"""Airflow's side of the things the core takes as plain options: connections turned into filesystem
options, the Airflow REST API, pools. The core never imports these."""
