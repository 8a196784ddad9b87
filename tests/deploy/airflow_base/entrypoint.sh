#!/usr/bin/env bash
# The official apache/airflow image's /entrypoint, as far as the Helm chart and docker/worker.Dockerfile
# use it (its source: scripts/docker/entrypoint_prod.sh): wait for the metadata database unless
# CONNECTION_CHECK_MAX_COUNT is 0 (the chart's probes set it so), then `bash ...` runs bash, `python ...`
# runs python, `airflow ...` and anything else run airflow with those arguments.
set -euo pipefail

: "${CONNECTION_CHECK_MAX_COUNT:=20}"
: "${CONNECTION_CHECK_SLEEP_TIME:=3}"

wait_for_airflow_db() {
    local tries=0
    until airflow db check >/dev/null 2>&1; do
        tries=$((tries + 1))
        if [[ ${tries} -ge ${CONNECTION_CHECK_MAX_COUNT} ]]; then
            echo "ERROR! Maximum number of retries (${CONNECTION_CHECK_MAX_COUNT}) reached." >&2
            echo "Last check result:" >&2
            airflow db check >&2 || true
            exit 1
        fi
        sleep "${CONNECTION_CHECK_SLEEP_TIME}"
    done
}

if [[ ${CONNECTION_CHECK_MAX_COUNT} -gt 0 ]]; then
    wait_for_airflow_db
fi

case "${1:-}" in
    bash) shift; exec /bin/bash "$@" ;;
    python) shift; exec python "$@" ;;
    airflow) shift; exec airflow "$@" ;;
    *) exec airflow "$@" ;;
esac
