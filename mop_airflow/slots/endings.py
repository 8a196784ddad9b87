"""How a slot's task ends: the last word its status says, and the slots of its block it ends with it.

The shard loop (:mod:`~mop_airflow.slots.driver`) trains until its machine says the block is over, or
raises. What the slot's status says then is what the other slots of its block judge it by
(:class:`~mop_airflow.slots.peers.PeerView`): yielded (it comes again), nothing (a later try of it runs),
failed for good or not (a retry follows), done. A slot that fails for good ends the slots of its block
that never started, or their tasks kept the run waiting for ever. Apart from the loop because it decides
what a try says when it is over, never what it trains.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from mop_airflow.errors import BlockIncompleteError
from mop_airflow.records.layout import RunLayout
from mop_airflow.slots.status import end_never_started, ended_or_never_started, read_status

# the driver's logger: the slot's lines keep the name they had (a deployment may set its level)
log = logging.getLogger("mop_airflow.slots.driver")


class SlotStopped(Exception):
    """The slot was asked to stop (its task was killed gracefully: SIGTERM, Airflow stopping): it ended
    after its hop in progress and its commits; a retry trains the rest."""


class SlotSuperseded(Exception):
    """A later try of this slot runs: this one was taken for dead (its host paused, or cut off while
    Airflow started the retry) and came back. It ended writing nothing more, not even its status: the
    later try's are the slot's (Rules.fence)."""


class SlotYielded(Exception):
    """The slot gave its pool slot back: a slot of its block ranked before it has not started (another
    block may hold its pool). Its committed hops stay; try the task again later."""


def ended_raising(loop: Any, layout: RunLayout, block: str, exc: BaseException, *, last_try: bool,
                  final: Callable[[BaseException], bool]) -> None:
    """The last word of a slot whose loop raised ``exc`` (the caller raises it on): yielded (with when it
    first yielded), none (a later try runs), or failed, for good when no retry follows (``last_try`` for a
    slot stopped on request, ``final(exc)`` else), then ending its block's never-started slots too."""
    if isinstance(exc, SlotYielded):
        # when this try first gave its pool slot back: its next start reads it back (Rules.yield_bound)
        loop.status.yielding_since = loop.machine.yielding_since or time.time()
        loop.status.stop("yielded", error=str(exc))
    elif isinstance(exc, SlotSuperseded):
        loop.status.abandon()  # no last word: the status is the later try's now
    elif loop.superseded():  # a copy taken for dead that failed (its input gone): no word over its retry's
        loop.status.abandon()
    else:
        ends = says_final(exc, last_try=last_try, final=final)
        if ends and isinstance(exc, Exception):
            exc.absent = end_the_unstarted(loop, layout, block, f"{type(exc).__name__}: {exc}")
        loop.status.stop("failed", final=ends, error=f"{type(exc).__name__}: {exc}"[:1000])


def says_final(exc: BaseException, *, last_try: bool, final: Callable[[BaseException], bool]) -> bool:
    """Whether a slot's try that raised ``exc`` says it failed for good: a slot stopped on request
    (SIGTERM) only on its last try, as no retry follows then and the slots waiting for it must not wait for
    ever; any other error as ``final`` says (the train operator's
    :func:`~mop_airflow.errors.fails_for_good`). The slot simulation's ends take it from here too."""
    return last_try if isinstance(exc, SlotStopped) else final(exc)


def ended(loop: Any, layout: RunLayout, block: str, result: Any, *, final: Callable[[BaseException], bool]) -> Any:
    """The last word of a slot whose loop returned ``result``, which it returns: done, or failed naming the
    hops it gave up (raises :class:`~mop_airflow.errors.BlockIncompleteError`). An ASHA slot whose search
    finished ends the block's slots no decision needed, which never started."""
    shard, slot = loop.slot_of
    if result.untrained:
        error = BlockIncompleteError(shard, slot, result.untrained, for_good=loop.for_good)
        error.absent = loop.absent  # the slots it waited for that never started
        if final(error):
            error.absent = end_the_unstarted(loop, layout, block, "it waited for their hops")
        loop.status.stop("failed", final=final(error), error=str(error)[:1000])
        raise error
    loop.status.stop("done")
    machine = loop.machine
    if not machine.alone and (not machine.asha or machine.ended):
        # the block is over without the slots that never started and had nothing left to do (no leg needed
        # them; every hop of theirs is of a configuration that failed): their tasks still wait in Airflow
        # for a worker or a pool slot, and the run with them (slot_sim seeds 4390, 24973, 90431). Only once
        # no other slot runs (read after this one's "done" is written, so of two ending at once the later
        # sees the earlier): a slot still running may wait for a failure they would settle (seeds 785, 75802)
        unneeded = machine.unneeded_slots()
        others = machine.block_slots() - {loop.slot_of}
        if unneeded and ended_or_never_started((read_status(layout, block, *o) for o in others), time.time(),
                                                 machine.wait):
            result.absent = end_the_unstarted(loop, layout, block, "the block finished without it: nothing of "
                                              "its was needed", state="done", owners=unneeded)
    return result


def end_the_unstarted(loop: Any, layout: RunLayout, block: str, why: str, state: str = "failed",
                      owners: set | None = None) -> list[tuple[int, int]]:
    """This slot failed for good, so its block has: the slots of the block that have not started (no
    status, yielded, or failed and waiting for a retry) are said failed for good too, and returned (the
    operator fails their tasks). Else a task that never starts (no worker on its queue, no slot in its
    pool) kept the run running for ever, whether or not a slot waited for its hops."""
    shard, slot = loop.slot_of
    try:
        said = (f"shard {shard} slot {slot} of its block failed for good ({why})" if state == "failed"
                else f"shard {shard} slot {slot} of its block ended: {why}")
        owners = loop.machine.block_slots() - {loop.slot_of} if owners is None else owners
        return end_never_started(layout, block, sorted(owners), said[:900], state=state)
    except Exception:  # noqa: BLE001 - the store may be what failed: this task's own error is the one to report
        log.warning("could not say the slots of block %s that never started failed for good", block, exc_info=True)
        return list(loop.absent)
