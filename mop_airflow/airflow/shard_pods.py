"""Moved to :mod:`mop_airflow.deployment.shard_pods` (ShardPods: the shard tasks as Kubernetes pods);
importing this old path warns (DeprecationWarning) and gives that module."""

from mop_airflow.airflow._moved import moved

moved("mop_airflow.airflow.shard_pods", "mop_airflow.deployment.shard_pods")
