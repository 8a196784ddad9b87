"""Provider metadata, so Airflow lists mop_airflow under Admin > Providers and knows its operators."""

from importlib.metadata import version


def get_provider_info() -> dict:
    return {
        "package-name": "mop-airflow",
        "name": "mop_airflow",
        "description": "Model hopper parallelism (MOP) model selection for Keras: shards stay, models hop.",
        "versions": [version("mop-airflow")],  # the installed distribution's, as pip knows it
        "operators": [{"integration-name": "mop_airflow",
                       "python-modules": ["mop_airflow.operators.train", "mop_airflow.operators.data",
                                          "mop_airflow.operators.plan", "mop_airflow.operators.report",
                                          "mop_airflow.operators.preflight", "mop_airflow.operators.promote",
                                          "mop_airflow.operators.check_models", "mop_airflow.operators.predict",
                                          "mop_airflow.operators.publish", "mop_airflow.operators.next_run",
                                          "mop_airflow.operators.decide"]}],
    }
