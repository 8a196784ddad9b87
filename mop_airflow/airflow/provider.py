"""Provider metadata, so Airflow lists mop_airflow under Admin > Providers and knows its operators."""

import pkgutil
from importlib.metadata import version
from importlib.util import find_spec


def operator_modules() -> list[str]:
    """The modules of ``mop_airflow.operators`` that define operators (all but their shared base), read
    from the installed package (a hand-kept list named a module that did not exist)."""
    spec = find_spec("mop_airflow.operators")
    names = [m.name for m in pkgutil.iter_modules(spec.submodule_search_locations) if m.name != "base"]
    return [f"mop_airflow.operators.{name}" for name in sorted(names)]


def get_provider_info() -> dict:
    return {
        "package-name": "mop-airflow",
        "name": "mop_airflow",
        "description": "Model hopper parallelism (MOP) model selection for Keras: shards stay, models hop.",
        "versions": [version("mop-airflow")],  # the installed distribution's, as pip knows it
        "operators": [{"integration-name": "mop_airflow", "python-modules": operator_modules()}],
    }
