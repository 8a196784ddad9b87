"""A block's train tasks wait for each other's hops, so a deployment that cannot run them all at once
is refused before anything trains, naming the setting, its value and the fix."""

import pytest

from mop_airflow.errors import SpecError
from mop_airflow.hooks.pools import check_parallelism, too_small


class Config:
    """What ``airflow.configuration.conf`` answers, for the two options read."""

    def __init__(self, executor, parallelism):
        self.values = {("core", "executor"): executor, ("core", "parallelism"): str(parallelism)}

    def get(self, section, key, fallback=None):
        return self.values.get((section, key), fallback)

    def getint(self, section, key, fallback=None):
        return int(self.values.get((section, key), fallback))


def test_a_local_executor_too_narrow_for_a_block_is_refused_naming_the_setting_and_the_fix():
    with pytest.raises(SpecError) as caught:
        check_parallelism(8, 2, Config("LocalExecutor", 8))
    error = caught.value
    assert (error.field, error.value) == ("[core] parallelism", 8)
    assert "runs 16 train tasks at once (8 shards x 2 slot(s))" in str(error)
    assert "AIRFLOW__CORE__PARALLELISM=17 or more" in error.fix
    check_parallelism(8, 2, Config("LocalExecutor", 17))  # room for every slot and a control task
    check_parallelism(8, 2, Config("LocalExecutor", 0))  # 0: unlimited
    check_parallelism(64, 1, Config("CeleryExecutor", 8))  # a Celery worker's concurrency is its own


def test_the_real_airflow_configuration_is_read_when_none_is_given(monkeypatch):
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "LocalExecutor")
    monkeypatch.setenv("AIRFLOW__CORE__PARALLELISM", "4")
    from airflow.configuration import conf

    assert conf.getint("core", "parallelism") == 4
    with pytest.raises(SpecError, match=r"\[core\] parallelism=4: the LocalExecutor runs at most 4 task"):
        check_parallelism(4, 1)


def test_pools_smaller_than_a_shards_slots_are_refused():
    names = ["mop_shard_0", "mop_shard_1"]
    with pytest.raises(SpecError) as caught:
        too_small({"mop_shard_0": 2, "mop_shard_1": 1, "default_pool": 128}, names, 2,
                  "mop-airflow pools sync --shards 2 --slots 2")
    error = caught.value
    assert error.field == "schedule.slots_per_shard" and error.value == 2
    assert "the pool mop_shard_1 has 1 slot(s)" in str(error) and "mop_shard_0" not in str(error).split("pool")[1]
    assert "mop-airflow pools sync --shards 2 --slots 2" in error.fix
    too_small({"mop_shard_0": 2, "mop_shard_1": -1}, names, 2, "")  # -1: an unlimited pool
    too_small({}, names, 2, "")  # missing pools are created or named elsewhere
