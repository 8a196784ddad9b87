"""The one exception hierarchy of mop_airflow.

Every error a user can cause says what was wrong (field or column), the value, the rule
and how to fix it, so a failed run or a failed DAG import is actionable from its message alone.
"""

from __future__ import annotations

from typing import Any, Iterable


class MopError(Exception):
    """Base class of every error mop_airflow raises on purpose."""


class SpecError(MopError, ValueError):
    """A configuration value breaks a rule; raised when the DAG is built, before any training."""

    def __init__(self, field: str, value: Any, rule: str, fix: str):
        self.field = field
        self.value = value
        self.rule = rule
        self.fix = fix
        super().__init__(f"{field}={value!r}: {rule}. Fix: {fix}")


def unknown_key(where: str, given: Any, known: Iterable[str], *, what: str = "a known key", advice: str = "") -> None:
    """Refuse the first key of mapping ``given`` that is not in ``known``, naming the nearest known key:
    a misspelt key (``num_sample``) must never fall back to a default without a word. ``advice`` ends the fix."""
    import difflib  # noqa: PLC0415

    known = list(known)
    unknown = sorted(str(k) for k in given if k not in known)
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise SpecError(f"{where}.{unknown[0]}", given[unknown[0]], f"is not {what}",
                        f"{hint}use only {sorted(known)}" + (f"; {advice}" if advice else ""))


class AirflowApiError(MopError, RuntimeError):
    """A call to Airflow's REST API failed: unreachable, refused (``status`` 401/403) or not found (404)."""

    def __init__(self, message: str, *, status: int | None = None):
        self.status = status
        super().__init__(message)


class DataValidationError(MopError):
    """The input data failed one or more expectations; nothing was trained or written."""

    def __init__(self, source: str, failures: Iterable[str]):
        self.source = source
        self.failures = list(failures)
        lines = "\n".join(f"  - {f}" for f in self.failures)
        super().__init__(
            f"input data {source} failed {len(self.failures)} expectation(s):\n{lines}"
        )


class PoolsMissingError(MopError):
    """A run needs Airflow pools that do not exist; it would otherwise sit in 'scheduled'."""

    def __init__(self, missing: Iterable[str], command: str, *, reason: str | None = None):
        self.missing = sorted(missing)
        self.command = command
        super().__init__(
            f"Airflow pools missing: {', '.join(self.missing)}"
            + (f" and not created: {reason}" if reason else "")
            + f". Tasks using a missing pool are never scheduled. Create them with: {command}"
        )


class StoreError(MopError):
    """The model store could not be reached or an object in it is missing or corrupt.

    ``transient``: the store did not answer (a later try may succeed), as opposed to answering no.
    """

    def __init__(self, message: str, *, transient: bool = False):
        super().__init__(message)
        self.transient = transient


class TrainingError(MopError):
    """A hop could not train (model builder failed, loss diverged, checkpoint mismatch)."""


class BlockIncompleteError(TrainingError):
    """A shard slot's task ended its block with hops it could not train: the configuration's previous
    hop belongs to another shard slot that failed for good, or made no progress within the wait bound.
    ``retryable``: every such slot may still come (late or hung, not ended), so the task is retried
    (its committed hops stay) instead of failing the block for good."""

    def __init__(self, shard: int, slot: int, untrained: dict[str, str], *, for_good: Iterable[str] | None = None):
        self.shard = shard
        self.slot = slot
        self.untrained = dict(untrained)  # "c003-e000a6 t=5" -> why
        # the hops whose slot ended for good (None: all of them, as before the distinction)
        self.for_good = set(self.untrained if for_good is None else for_good)
        self.retryable = not self.for_good
        lines = "\n".join(f"  - {hop}: {why}" for hop, why in sorted(self.untrained.items()))
        fix = ("Airflow retries this task, which waits again; the hops committed stay. If it keeps failing, "
               "check that the slots named above get their pool slots (another DAG may hold them) and are not hung"
               if self.retryable else
               "read the log of the shard task named above, fix its cause, then clear the failed shard tasks of "
               "this run: they skip the hops already committed and train the rest")
        super().__init__(
            f"shard {shard} slot {slot} trained every hop it could, but {len(self.untrained)} of its hops never "
            f"became ready:\n{lines}\nFix: {fix}")


# Failures a retry cannot fix: the spec, the data, missing pools, a model that cannot train.
# StoreError is left out on purpose: an unreachable store may be back on the next try.
NOT_RETRIED = (SpecError, DataValidationError, PoolsMissingError, TrainingError)


def fails_for_good(exc: BaseException, *, last_try: bool, fail_fast: bool = False) -> bool:
    """Whether a shard slot's try that raised ``exc`` fails its task for good, no retry following: an error
    a retry cannot fix (:data:`NOT_RETRIED`), unless a block left incomplete only by slots that may still
    come (:attr:`BlockIncompleteError.retryable`); ``search.fail_fast``; or its last try. The train
    operator's rule, which the slot simulation runs too (a slot that waits on this one stops waiting then)."""
    return ((isinstance(exc, NOT_RETRIED) and not getattr(exc, "retryable", False)) or fail_fast or last_try)

