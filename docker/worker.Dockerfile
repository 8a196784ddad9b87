# mop_airflow's image: the official Apache Airflow image extended as Airflow's docs recommend ("Extending
# the image": the same Airflow pinned, the project and its extras added by pip as the airflow user), so
# it runs wherever the official image runs: the official Helm chart (its `bash -c "exec airflow ..."`
# args, its `/entrypoint airflow jobs check` probes, UID 50000), docker/docker-compose.yaml, plain docker.
#   CPU:  docker build -f docker/worker.Dockerfile -t mop-airflow-worker:cpu .
#   GPU:  docker build -f docker/worker.Dockerfile --build-arg TF_PACKAGE="tensorflow[and-cuda]" \
#             --build-arg JAX_PACKAGE="jax[cuda12]" -t mop-airflow-worker:cuda .
#   Another Airflow: --build-arg BASE_IMAGE=apache/airflow:<version>-python3.11 (and AIRFLOW_VERSION
#   follows the base: the official image sets it).
# A shard worker serves one shard: `airflow celery worker --queues mop_shard_<s> --concurrency <slots>`
# (the shard's pool has as many slots: `mop-airflow pools sync --slots <slots>`).
# GPU image: the tensorflow[and-cuda] wheels bring CUDA 12 and cuDNN, so the host needs only the NVIDIA
# driver (>= 525.60.13 on Linux, as TensorFlow's install guide asks) and, for Docker, the NVIDIA Container
# Toolkit (`docker run --gpus all`, or a device reservation in Compose: docker/docker-compose.gpu.yaml).
# MOP_GPUS: the GPUs this worker's hop slots share out (a count, or ids with a comma); empty: those of
# CUDA_VISIBLE_DEVICES, or none (a CPU worker). MOP_SLOTS: the worker's --concurrency. Each hop task
# claims a free slot and sees only that slot's GPU (mop_airflow.training.devices).
ARG BASE_IMAGE=apache/airflow:3.3.1-python3.11
FROM ${BASE_IMAGE}

ARG TF_PACKAGE="tensorflow"
ARG JAX_PACKAGE=""
# What a deployment needs beside the core: Celery workers with PostgreSQL and Redis, the S3 store's
# connection type (aws), the KubernetesExecutor (kubernetes), the example data and TensorBoard files.
ARG MOP_EXTRAS="examples,celery,aws,kubernetes,tensorboard"
# Optional: a pip constraints file (a path the build can read, or a URL), e.g. Airflow's constraints for
# AIRFLOW_VERSION, or the versions your tests passed with (`pip list --format=freeze`), for a repeatable image.
ARG MOP_CONSTRAINTS=""
ENV MOP_AIRFLOW_HOME=/opt/mop \
    TF_CPP_MIN_LOG_LEVEL=2 \
    PYTHONUNBUFFERED=1 \
    MOP_GPUS="" \
    MOP_SLOTS="" \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

USER root
RUN mkdir -p /opt/mop/cache /opt/mop-src /opt/airflow/config /home/airflow/.cache/pip \
 && chown -R airflow:0 /opt/mop /opt/mop-src /opt/airflow/config /home/airflow/.cache \
 && chmod -R g+rwX /opt/mop
USER airflow

COPY --chown=airflow:0 pyproject.toml README.md /opt/mop-src/
COPY --chown=airflow:0 mop_airflow /opt/mop-src/mop_airflow
COPY --chown=airflow:0 operators /opt/mop-src/operators
COPY --chown=airflow:0 plugins /opt/mop-src/plugins
# apache-airflow pinned to the base's version, as Airflow's docs ask, so pip never swaps Airflow itself.
# The FAB provider and StatsD's client: the chart configures its auth manager and turns StatsD on (the
# official image ships both). The cache mount
# keeps downloaded wheels out of the image (and, with Docker's BuildKit, between builds).
RUN --mount=type=cache,target=/home/airflow/.cache/pip,uid=50000,gid=0 \
    pip install ${MOP_CONSTRAINTS:+--constraint "$MOP_CONSTRAINTS"} "apache-airflow[statsd]==${AIRFLOW_VERSION}" \
        "${TF_PACKAGE}" ${JAX_PACKAGE:+"$JAX_PACKAGE"} "/opt/mop-src[${MOP_EXTRAS}]" "apache-airflow-providers-fab" \
 && pip list --format=freeze | grep -E "^(apache-airflow|apache-airflow-providers-[a-z-]+|tensorflow|keras|jax|s3fs)=="

# Keras is imported once in a Celery worker and inherited by every forked task (mop_airflow.deployment.preload);
# the chart mounts the same file from its airflowLocalSettings (mop-airflow k8s values writes it).
RUN printf 'from mop_airflow.deployment.preload import preload_if_task_host\npreload_if_task_host()\n' \
    > /opt/airflow/config/airflow_local_settings.py
