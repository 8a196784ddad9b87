# mop_airflow shard worker: Airflow 3 + the training stack + mop_airflow.
#   CPU:  docker build -f docker/worker.Dockerfile -t mop-airflow-worker .
#   GPU:  docker build -f docker/worker.Dockerfile --build-arg TF_PACKAGE="tensorflow[and-cuda]" -t mop-airflow-worker:cuda .
#   Keras on JAX: add --build-arg JAX_PACKAGE="jax[cuda12]" and run the worker with KERAS_BACKEND=jax.
# A worker serves one shard: `airflow celery worker --queues mop_shard_<s> --concurrency <slots>`
# (the shard's pool has as many slots: `mop-airflow pools sync --slots <slots>`).
# GPU image: the tensorflow[and-cuda] wheels bring CUDA 12 and cuDNN, so the host needs only the NVIDIA
# driver (>= 525.60.13 on Linux, as TensorFlow's install guide asks) and, for Docker, the NVIDIA Container
# Toolkit (`docker run --gpus all`, or a device reservation in Compose).
# MOP_GPUS: the GPUs this worker's hop slots share out (a count, or ids with a comma); empty: those of
# CUDA_VISIBLE_DEVICES, or none (a CPU worker). MOP_SLOTS: the worker's --concurrency. Each hop task
# claims a free slot and sees only that slot's GPU (mop_airflow.training.devices).
FROM python:3.11-slim

ARG TF_PACKAGE="tensorflow"
ARG JAX_PACKAGE=""
ENV PIP_NO_CACHE_DIR=1 \
    AIRFLOW_HOME=/opt/airflow \
    MOP_AIRFLOW_HOME=/opt/mop \
    TF_CPP_MIN_LOG_LEVEL=2 \
    PYTHONUNBUFFERED=1 \
    MOP_GPUS="" \
    MOP_SLOTS="" \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

RUN useradd --create-home --uid 50000 airflow \
 && mkdir -p /opt/airflow/config /opt/mop/cache /opt/mop-src \
 && chown -R airflow /opt/airflow /opt/mop

WORKDIR /opt/mop-src
COPY pyproject.toml README.md ./
COPY mop_airflow ./mop_airflow
COPY operators ./operators
COPY plugins ./plugins
RUN pip install "${TF_PACKAGE}" ${JAX_PACKAGE:+"$JAX_PACKAGE"} ".[examples,celery,tensorboard]" "apache-airflow-providers-amazon" \
 && pip list --format=freeze | grep -E "^(apache-airflow|tensorflow|keras|jax|s3fs|pyarrow)=="

# Keras is imported once in the worker and inherited by every forked task (see mop_airflow.airflow.preload).
RUN printf 'from mop_airflow.airflow.preload import preload_if_task_host\npreload_if_task_host()\n' \
    > /opt/airflow/config/airflow_local_settings.py

USER airflow
WORKDIR /opt/airflow
ENTRYPOINT ["airflow"]
CMD ["celery", "worker", "--queues", "mop_shard_0", "--concurrency", "1"]
