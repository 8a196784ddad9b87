"""``mop-airflow k8s``: the official Airflow Helm chart's values for two releases, the control
plane and a worker set per shard (``values``), and the shards' volumes for shard tasks as pods
(``volumes``). Both only write files (or standard output); nothing here talks to a cluster."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mop_airflow.cli.runs import OK, USAGE, fail

_FIX_DOC = "see docs/how-to/kubernetes.md"


def _shape(args: argparse.Namespace):
    from mop_airflow.deployment.kubernetes_shape import ClusterShape  # noqa: PLC0415

    return ClusterShape(args.shards, args.slots, args.gpus_per_slot, args.gpus_per_node,
                        node_selector=args.node_selector or [])


def _write(text: str, out: str | None, what: str) -> None:
    if out is None or out == "-":
        sys.stdout.write(text)
        return
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(text)
    print(f"{what}: {out}", file=sys.stderr)


def shards_file(out: str) -> str:
    """The shard release's values file beside the control release's: ``mop-values.yaml`` ->
    ``mop-values-shards.yaml``."""
    path = Path(out)
    return str(path.with_name(f"{path.stem}-shards{path.suffix or '.yaml'}"))


def cmd_values(args: argparse.Namespace) -> int:
    from mop_airflow.errors import SpecError  # noqa: PLC0415
    from mop_airflow.deployment.helm_values import HelmValues  # noqa: PLC0415

    try:
        values = HelmValues(_shape(args), image=args.image, control_image=args.control_image, release=args.release,
                            storage_size=args.storage_size, log_size=args.log_size,
                            storage_class=args.storage_class, s3_secret=None if args.no_s3 else args.s3_secret,
                            s3_conn_id=args.s3_conn_id, control_concurrency=args.control_concurrency,
                            api_secret=None if args.no_api_secret else args.api_secret)
    except SpecError as exc:
        return fail(str(exc), USAGE)
    if "-" in (args.out, args.shards_out):
        return fail("--out=-: the values are two files, one a release. Fix: give --out FILE (and --shards-out FILE)",
                    USAGE)
    shards_out = args.shards_out or shards_file(args.out)
    if Path(shards_out).resolve() == Path(args.out).resolve():
        return fail(f"--shards-out={shards_out}: is the file --out writes. Fix: give the shard release's values a "
                    "file of their own", USAGE)
    names = {"control_file": Path(args.out).name, "shards_file": Path(shards_out).name}  # as the headers name them
    _write(values.to_yaml(**names), args.out,
           f"Helm values of the release {values.release} (control plane, default worker)")
    _write(values.shards_yaml(**names), shards_out,
           f"Helm values of the release {values.shard_release} (a worker set per shard)")
    for line in values.helm_commands(args.out, shards_out):
        print(f"  {line}", file=sys.stderr)
    return OK


def cmd_volumes(args: argparse.Namespace) -> int:
    import yaml  # noqa: PLC0415

    from mop_airflow.errors import SpecError  # noqa: PLC0415
    from mop_airflow.deployment.shard_pods import ShardPods  # noqa: PLC0415

    try:
        shape = _shape(args)
        pods = ShardPods(volume_claim=args.claim)
        claims = pods.volume_claims(shape.shards, size=args.storage_size, storage_class=args.storage_class)
    except SpecError as exc:
        return fail(str(exc), USAGE)
    command = (f"mop-airflow k8s volumes --shards {shape.shards} --storage-size {args.storage_size}"
               + (f" --storage-class {args.storage_class}" if args.storage_class else "")
               + (f" --claim {args.claim}" if args.claim != ShardPods().volume_claim else ""))
    header = (f"# The shard volumes of {shape.shards} shard(s) for shard tasks as pods, written by: {command}\n"
              "# kubectl apply -f THIS_FILE\n")
    _write(header + yaml.safe_dump_all(claims, sort_keys=False), args.out, "volume claims")
    return OK


def add_commands(sub: argparse._SubParsersAction) -> None:
    k8s = sub.add_parser("k8s", help="Kubernetes: Helm values for a worker set per shard, the shards' volumes")
    actions = k8s.add_subparsers(dest="action", required=True)

    def shape_options(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument("--shards", type=int, required=True, help="the spec's schedule.shards")
        cmd.add_argument("--slots", type=int, default=1, help="schedule.slots_per_shard: models a shard trains at "
                                                              "once (default 1)")
        cmd.add_argument("--gpus-per-slot", type=int, default=1, help="GPUs each slot asks for (default 1)")
        cmd.add_argument("--gpus-per-node", type=int, default=8,
                         help="GPUs of one node of the GPU pool: a shard's slots share one node (default 8)")
        cmd.add_argument("--node-selector", action="append", metavar="KEY=VALUE",
                         help="a node label the shard pods need (repeat for several), e.g. pool=gpu")
        cmd.add_argument("--storage-size", default="50Gi", help="each shard's cache volume (default 50Gi)")
        cmd.add_argument("--storage-class", help="the volumes' StorageClass (default: the cluster's default)")

    values = actions.add_parser(
        "values", help="write the official Airflow Helm chart's values: the control plane, and a Celery worker set "
                       "per shard",
        description="Two releases of the chart, so that only the shard workers run the CUDA image. --out: the "
                    "release --release (API server, scheduler, DAG processor, triggerer, the default worker set for "
                    "the data and control tasks) on --control-image. --shards-out: the release <release>-shards, a "
                    "worker set per shard (queue mop_shard_<s>, one replica, concurrency = slots, the slots' GPUs, "
                    "MOP_GPUS/MOP_SLOTS, a volume for the shard's cache) on --image, with the first release's "
                    f"Secrets. The S3 store's connection comes from a Kubernetes Secret ({_FIX_DOC}).")
    shape_options(values)
    values.add_argument("--out", default="mop-values.yaml",
                        help="the control release's values file (default mop-values.yaml)")
    values.add_argument("--shards-out", help="the shard release's values file (default: --out's name with -shards, "
                                             "mop-values-shards.yaml)")
    values.add_argument("--release", default="airflow",
                        help="the control release's name (default airflow); the shard workers' is <release>-shards")
    values.add_argument("--image", default="mop-airflow-worker:cuda",
                        help="the shard workers' image (docker/worker.Dockerfile, CUDA and JAX build) as "
                             "repository[:tag]")
    values.add_argument("--control-image", default="mop-airflow-worker:cpu",
                        help="the image of every other Airflow component (docker/worker.Dockerfile as it is, no "
                             "CUDA) as repository[:tag]")
    values.add_argument("--log-size", default="5Gi",
                        help="each worker's log volume, the chart's StatefulSet log claim (default 5Gi)")
    values.add_argument("--s3-secret", default="mop-s3",
                        help="the Secret holding the store's Airflow connection (default mop-s3)")
    values.add_argument("--s3-conn-id", default="aws_default",
                        help="the store's connection id (store.conn_id); the Secret's key is AIRFLOW_CONN_<ID>")
    values.add_argument("--no-s3", action="store_true", help="no store connection (a store every pod mounts)")
    values.add_argument("--api-secret", default="mop-api",
                        help="the Secret holding the REST API login the tasks sign in with (key "
                             "AIRFLOW_CONN_MOP_AIRFLOW_API, a user who may edit pools; default mop-api)")
    values.add_argument("--no-api-secret", action="store_true",
                        help="no API login (the DAGs built with pools='off', the pools synced by hand)")
    values.add_argument("--control-concurrency", type=int, default=2,
                        help="data and control tasks the default worker runs at once (default 2)")
    values.set_defaults(func=cmd_values)

    volumes = actions.add_parser(
        "volumes", help="write the shards' PersistentVolumeClaims for shard tasks as pods",
        description="One ReadWriteOnce claim per shard, named as ShardPods.volume_claim names them "
                    f"(mop-shard-<s>-cache), for build_mop_dag(..., kubernetes=ShardPods(...)) ({_FIX_DOC}).")
    shape_options(volumes)
    volumes.add_argument("--out", help="the file to write (default: standard output)")
    volumes.add_argument("--claim", default="mop-shard-{shard}-cache",
                         help="the claims' name, {shard} replaced by the shard (default mop-shard-{shard}-cache)")
    volumes.set_defaults(func=cmd_volumes)
