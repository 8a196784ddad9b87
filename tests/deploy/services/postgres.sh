#!/usr/bin/env bash
# What docker/docker-compose.yaml uses of the postgres image: a server on port 5432 with the user
# POSTGRES_USER (password POSTGRES_PASSWORD, checked on every TCP connection) owning the database POSTGRES_DB,
# in UTF8 as the image makes it (a container without a locale gave initdb's SQL_ASCII, where psycopg 3 reads
# text as bytes and the Celery result backend's first connection raised in the scheduler).
set -euo pipefail
bin=$(ls -d /usr/lib/postgresql/*/bin | head -n 1)
data=/var/lib/postgresql/standin
mkdir -p "${data}" /run/postgresql
chown postgres "${data}" /run/postgresql
printf '%s\n' "${POSTGRES_PASSWORD}" > /tmp/pwfile && chown postgres /tmp/pwfile
runuser -u postgres -- "${bin}/initdb" -D "${data}" -U "${POSTGRES_USER}" --pwfile=/tmp/pwfile \
    --auth-local=trust --auth-host=scram-sha-256 --encoding=UTF8 --no-locale >/dev/null
rm /tmp/pwfile
echo "host all all 0.0.0.0/0 scram-sha-256" >> "${data}/pg_hba.conf"
runuser -u postgres -- "${bin}/pg_ctl" -D "${data}" -w -o "-c listen_addresses=''" start >/dev/null
# initdb makes only the database "postgres"; the postgres image makes POSTGRES_DB (its user's name by default)
db="${POSTGRES_DB:-${POSTGRES_USER}}"
if [[ "${db}" != "postgres" ]]; then
    runuser -u postgres -- "${bin}/createdb" -U "${POSTGRES_USER}" "${db}"
fi
runuser -u postgres -- "${bin}/pg_ctl" -D "${data}" -w stop >/dev/null
exec runuser -u postgres -- "${bin}/postgres" -D "${data}" -c listen_addresses='*'
