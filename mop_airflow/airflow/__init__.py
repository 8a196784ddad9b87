"""The one boundary with Airflow: rendering the task plan into a DAG, pools, connections, REST,
and the local embedded Airflow. Nothing outside this package (and the operators) imports Airflow."""
