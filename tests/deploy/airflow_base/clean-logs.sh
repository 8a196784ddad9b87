#!/usr/bin/env bash
# The official apache/airflow image's /clean-logs (the chart's log groomer sidecars run it): every
# AIRFLOW__LOG_RETENTION_DAYS days' old log file under AIRFLOW_HOME/logs removed, every
# AIRFLOW__LOG_CLEANUP_FREQUENCY_MINUTES minutes.
set -euo pipefail
readonly DIRECTORY="${AIRFLOW_HOME:-/opt/airflow}/logs"
readonly RETENTION="${AIRFLOW__LOG_RETENTION_DAYS:-15}"
readonly FREQUENCY="${AIRFLOW__LOG_CLEANUP_FREQUENCY_MINUTES:-15}"
while true; do
    echo "Trimming airflow logs to ${RETENTION} days."
    find "${DIRECTORY}"/ -type d -name 'lost+found' -prune -o -type f -mtime +"${RETENTION}" -name '*.log' -print0 \
        | xargs -0 rm -f || true
    find "${DIRECTORY}"/ -type d -empty -delete || true
    sleep "$((FREQUENCY * 60))"
done
