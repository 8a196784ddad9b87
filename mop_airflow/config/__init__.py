"""What the user asks for: the typed, validated spec (:mod:`.spec`), the trigger form of a DAG
(:mod:`.form`) and a trigger conf applied to the spec (:mod:`.trigger`). No Airflow, no TensorFlow."""

from mop_airflow.config.spec import (  # noqa: F401 - the package's names
    SPEC_SECTIONS, default_home, metric_direction, DataSpec, INTERPOLATIONS, COLOR_MODES, ScheduleSpec,
    StoreSpec, SearchSpec, WARM_START_SELECT, warm_start_spec, PublishSpec, MopSpec, section_overrides,
)
