"""Build every distinct model once on the data's shapes, beside the staging of the shards.

The work is :func:`mop_airflow.training.model_check.check_models`. A builder that fails for every
configuration using it (a wrong import path, not a Keras model, inputs or outputs that do not fit
the data) fails the run here, before any hop; so does any failure with ``search.fail_fast``.
Otherwise the configurations that cannot train are only logged: their first hop marks them failed
with the same reason and the others train.
"""

from __future__ import annotations

from typing import Any

from mop_airflow.errors import TrainingError
from mop_airflow.records import Manifest

from mop_airflow.operators.base import MopBaseOperator


class MopCheckModelsOperator(MopBaseOperator):
    ui_color = "#e3f4e1"

    def work(self, context: Any) -> dict[str, Any]:
        if self.continuation(context) is not None:  # the search's first run checked them; no TensorFlow
            return {"models_built": 0, "cannot_train": [], "continues": True}
        from mop_airflow.data.cache import manifest_inputs  # noqa: PLC0415
        from mop_airflow.data.inputs import input_shapes  # noqa: PLC0415
        from mop_airflow.training.model_check import check_models  # noqa: PLC0415 - TensorFlow loads here

        layout = self.layout(context)
        run = self.run_record(layout)
        manifest = Manifest.read(layout.store, layout.manifest_pointer_uri)
        found = check_models(run.configs, input_shapes=input_shapes(manifest_inputs(manifest)),
                             num_classes=len(manifest.classes), task=manifest.task, seed=run.schedule.seed)
        if (run.adaptive or {}).get("method") == "pbt":  # a copy goes on with its parent's weights: they must fit
            from mop_airflow.search.pbt import mutations  # noqa: PLC0415
            from mop_airflow.training.model_check import check_mutations  # noqa: PLC0415

            check_mutations(run.configs, mutations(run.adaptive["mutations"]),
                            input_shapes=input_shapes(manifest_inputs(manifest)), num_classes=len(manifest.classes),
                            task=manifest.task, seed=run.schedule.seed)
        fatal = found.fatal(run.configs, fail_fast=run.fail_fast)
        if fatal:
            raise TrainingError(fatal)
        for cid, reason in sorted(found.failures.items()):
            self.log.warning("%s cannot train and will be marked failed at its first hop: %s", cid, reason)
        self.log.info("built %d distinct models for %d configurations; %d cannot train", found.built,
                      len(run.configs), len(found.failures))
        return {"models_built": found.built, "cannot_train": sorted(found.failures)}
