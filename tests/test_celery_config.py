"""`mop-airflow celery config`: the environment file of a Celery deployment, without starting anything
(tests/test_celery_howto.py runs a deployment from it)."""

import json
import stat

from mop_airflow.deployment import celery_config
from mop_airflow.deployment.celery_config import read_env_file
from mop_airflow.cli.main import main

BROKER = "redis://127.0.0.1:6379/0"
DATABASE = "postgresql+psycopg2://postgres@127.0.0.1:5432/airflow"


def configure(tmp_path, *extra):
    return main(["celery", "config", "--broker", BROKER, "--database", DATABASE, "--airflow-home",
                 str(tmp_path / "airflow"), "--mop-home", str(tmp_path / "mop"), *extra])


def test_the_file_holds_the_deployment_the_login_and_the_lost_worker_settings(tmp_path):
    assert configure(tmp_path, "--api-url", "http://10.0.0.5:8080") == 0
    path = tmp_path / "airflow" / "mop-celery.env"
    env = read_env_file(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # a secret and a password
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == DATABASE
    assert env["AIRFLOW__CELERY__RESULT_BACKEND"] == "db+" + DATABASE
    assert env["AIRFLOW__CELERY__BROKER_URL"] == BROKER
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://10.0.0.5:8080/execution/"
    assert env["AIRFLOW__API__PORT"] == "8080"
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == str(tmp_path / "airflow" / "dags")
    assert env["MOP_HOME"] == str(tmp_path / "mop")
    assert len(env["AIRFLOW__API_AUTH__JWT_SECRET"]) == 64
    # the log server's key: one for every machine, so a task's log is read from the API server's machine
    assert len(env["AIRFLOW__API__SECRET_KEY"]) == 64 and env["AIRFLOW__API__SECRET_KEY"] != env["AIRFLOW__API_AUTH__JWT_SECRET"]
    # the bound the docs state comes from these
    assert env["AIRFLOW__CELERY__TASK_ACKS_LATE"] == "True"
    assert env["AIRFLOW__CELERY__WORKER_PREFETCH_MULTIPLIER"] == "1"
    assert env["AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT"] == "30"
    assert env["AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__UNACKED_RESTORE_INTERVAL"] == "5"
    assert env["AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__UNACKED_RESTORE_THROTTLE"] == "1"
    assert env["AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT"] == "60"
    assert celery_config.QUEUED_BOUND_S == 60 and celery_config.RUNNING_BOUND_S == 115
    # the tasks and the command line sign in as admin, with the password the simple auth manager will use
    password = json.loads((tmp_path / "airflow" / "simple_auth_manager_passwords.json.generated").read_text())["admin"]
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] == "False"
    assert env["AIRFLOW_CONN_MOP_AIRFLOW_API"] == f"http://admin:{password}@10.0.0.5:8080"
    assert (env["MOP_API_USER"], env["MOP_API_PASSWORD"]) == ("admin", password)
    hook = (tmp_path / "airflow" / "config" / "airflow_local_settings.py").read_text()
    assert "preload_if_task_host()" in hook


def test_writing_it_again_keeps_the_secret_and_the_password(tmp_path):
    assert configure(tmp_path) == 0
    first = read_env_file(tmp_path / "airflow" / "mop-celery.env")
    assert configure(tmp_path, "--api-url", "http://127.0.0.1:9090") == 0
    second = read_env_file(tmp_path / "airflow" / "mop-celery.env")
    assert second["AIRFLOW__API_AUTH__JWT_SECRET"] == first["AIRFLOW__API_AUTH__JWT_SECRET"]
    assert second["AIRFLOW__API__SECRET_KEY"] == first["AIRFLOW__API__SECRET_KEY"]
    assert second["MOP_API_PASSWORD"] == first["MOP_API_PASSWORD"]
    assert second["AIRFLOW__API__BASE_URL"] == "http://127.0.0.1:9090"


def test_a_broker_other_than_redis_or_a_sqlite_database_is_refused_naming_the_option(tmp_path, capsys):
    assert main(["celery", "config", "--broker", "amqp://guest@localhost//", "--database", DATABASE,
                 "--airflow-home", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--broker='amqp://guest@localhost//'" in err and "visibility timeout" in err and "Fix:" in err
    assert main(["celery", "config", "--broker", BROKER, "--database", "sqlite:////tmp/airflow.db",
                 "--airflow-home", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--database='sqlite:////tmp/airflow.db'" in err and "PostgreSQL" in err and "Fix:" in err
    assert not (tmp_path / "mop-celery.env").exists()


def test_the_compose_file_bounds_a_lost_worker_with_the_same_settings(tmp_path):
    import yaml

    from tests.conftest import REPO

    assert configure(tmp_path) == 0
    env = read_env_file(tmp_path / "airflow" / "mop-celery.env")
    compose = yaml.safe_load((REPO / "docker" / "docker-compose.yaml").read_text())["x-airflow-common"]["environment"]
    lost_worker = [k for k in env if k.startswith(("AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__", "AIRFLOW__SCHEDULER__"))
                   or k in ("AIRFLOW__CELERY__TASK_ACKS_LATE", "AIRFLOW__CELERY__WORKER_PREFETCH_MULTIPLIER")]
    assert len(lost_worker) == 7
    assert {k: compose[k].lower() for k in lost_worker} == {k: env[k].lower() for k in lost_worker}
