"""The slot protocol: how the shard slots of a block share its hops without a coordinator.

:mod:`.machine` takes every decision as a pure state machine (sans-IO) on the words of :mod:`.messages`;
:mod:`.driver` carries its actions out in a train task (the store, its threads and the clock); a slot
says what it does in its status file (:mod:`.status`), leaves a marker a commit (:mod:`.commits`), and
is killed by its :mod:`.watchdog` when its progress stops. The deterministic simulation that checks
these rules over many schedules lives outside the runtime package (``slot_sim``, beside the tests).
"""
