"""The `mop-airflow` command: the parser, assembled from the command families' modules, and ``main``.

Each family holds its commands and their options: :mod:`~mop_airflow.cli.check` (a spec without
Airflow), :mod:`~mop_airflow.cli.plan`, :mod:`~mop_airflow.cli.up` (`up`, `example-data`),
:mod:`~mop_airflow.cli.demo`, :mod:`~mop_airflow.cli.runs` (`status`, `report`, `runs`),
:mod:`~mop_airflow.cli.models` (`predict`, `export-best`, `export-study`),
:mod:`~mop_airflow.cli.champion`, :mod:`~mop_airflow.cli.deployment` (`pools`, `celery`) and
:mod:`~mop_airflow.cli.kubernetes` (`k8s`). Everything heavy is imported inside the command that needs it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from mop_airflow.cli import champion, check, demo, deployment, kubernetes, models, plan, runs, up
from mop_airflow.cli.runs import DEFAULT_PORT, FAILED, INTERRUPTED, OK, UNAVAILABLE, USAGE, fail
from mop_airflow.cli.up import port_free as _port_free
from mop_airflow.config.environment import project_home

__all__ = ["DEFAULT_PORT", "FAILED", "INTERRUPTED", "OK", "UNAVAILABLE", "USAGE", "_port_free", "build_parser", "main"]

DESCRIPTION = ("Keras model selection with model hopper parallelism on Apache Airflow: check a spec without "
               "Airflow, run a DAG folder on a local Airflow, follow runs, read their reports and use their models. "
               "`mop-airflow COMMAND --help` describes a command.")
EPILOG = ("exit codes, the same for every command: 0 done (a followed run succeeded); 1 the run or the work failed; "
          "2 bad usage or input; 3 Airflow or the store could not be reached, or the DAG or run does not exist; "
          "130 stopped with Ctrl-C. The project home (the store, the data, reports) is $MOP_HOME, else ~/mop_airflow.")


class HelpFormatter(argparse.HelpFormatter):
    """Every option's default shown: appended as ``(default: X)`` where its help does not say it already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (not action.option_strings or "default" in text or action.default in (None, False, argparse.SUPPRESS)
                or text == argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)"


class SubCommands(argparse._SubParsersAction):
    """A command's one-line help is its description too, where it has no longer one; an argument the
    command does not take is refused by the command's own parser, whose usage lists what it takes
    (argparse's own refusal comes from the top level: `usage: mop-airflow [-h] COMMAND ...`)."""

    def add_parser(self, name: str, **kwargs):
        kwargs.setdefault("description", kwargs.get("help"))
        return super().add_parser(name, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        unknown = getattr(namespace, argparse._UNRECOGNIZED_ARGS_ATTR, None)
        if unknown:
            self._name_parser_map[values[0]].error(
                f"unrecognized arguments: {' '.join(unknown)} (`{self._prog_prefix} {values[0]} --help` lists "
                "the arguments it takes)")


class Parser(argparse.ArgumentParser):
    """Every command and sub-command gets the same help formatting (sub-parsers are made of this class)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", SubCommands)


def build_parser() -> argparse.ArgumentParser:
    home = project_home()
    parser = Parser(prog="mop-airflow", description=DESCRIPTION, epilog=EPILOG)
    sub = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
    check.add_commands(sub)
    plan.add_commands(sub)
    up.add_commands(sub, home)
    demo.add_commands(sub, home)
    runs.add_commands(sub, home)
    models.add_commands(sub, home)
    champion.add_commands(sub, home)
    deployment.add_commands(sub)
    kubernetes.add_commands(sub)
    return parser


def quiet_libraries() -> None:
    """Keep what the libraries log at import out of a command's output: TensorFlow's C++ notes (the
    CPU's instructions, no CUDA driver) and Great Expectations' registration lines (a screenful
    when the data is validated, in the format of Airflow's logging once a DAG file imported it).
    Their warnings and errors still show; a TF_CPP_MIN_LOG_LEVEL set in the environment wins."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.getLogger("great_expectations").setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet_libraries()
    for name in ("shards", "slots", "k", "batch_rows", "limit"):
        value = getattr(args, name, None)
        if value is not None and value < 1 and args.command != "k8s":  # k8s names the value and the fix itself
            return fail(f"--{name.replace('_', '-')} must be at least 1", USAGE)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
