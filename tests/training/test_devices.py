"""Each hop slot of a machine gets its own GPU: the placement table, the slot claim across processes,
the environment it sets, and a CPU machine left exactly as it was. No GPU and no TensorFlow needed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mop_airflow.errors import SpecError
from mop_airflow.training.devices import (
    DevicePlacement, apply_placement, choose_device, claim_slot, default_lock_dir, gpus_from_env,
    place_this_process, slots_from_env, backend_started,
)

REPO = Path(__file__).resolve().parents[2]


# --- the table: which GPU each slot gets -------------------------------------------------------

def test_one_gpu_one_slot_grows_memory_on_demand_unless_asked_to_reserve_the_gpu():
    assert choose_device(0, 1, 1) == DevicePlacement(slot=0, gpu="0", visible_devices="0",
                                                     memory_growth=True, slots_sharing=1)
    assert choose_device(0, 1, 1, reserve=True).memory_growth is False


def test_one_gpu_two_slots_share_gpu_0_and_grow_memory_on_demand():
    placements = [choose_device(slot, 1, 2) for slot in range(2)]
    assert [p.visible_devices for p in placements] == ["0", "0"]
    assert [p.memory_growth for p in placements] == [True, True]
    assert [p.slots_sharing for p in placements] == [2, 2]


def test_two_gpus_two_slots_one_gpu_each_reserved_only_when_asked():
    placements = [choose_device(slot, 2, 2) for slot in range(2)]
    assert [p.gpu for p in placements] == ["0", "1"]
    assert [p.memory_growth for p in placements] == [True, True]
    assert [p.slots_sharing for p in placements] == [1, 1]
    assert [choose_device(slot, 2, 2, reserve=True).memory_growth for slot in range(2)] == [False, False]


def test_an_explicit_list_maps_slots_onto_its_ids_in_order():
    assert [choose_device(slot, ["2", "3"], 2).visible_devices for slot in range(2)] == ["2", "3"]
    # three slots on 2,3: GPU 2 carries slots 0 and 2 (grows), GPU 3 only slot 1 (reserves)
    three = [choose_device(slot, ["2", "3"], 3, reserve=True) for slot in range(3)]
    assert [(p.gpu, p.slots_sharing, p.memory_growth) for p in three] == [
        ("2", 2, True), ("3", 1, False), ("2", 2, True)]


def test_no_gpu_is_a_cpu_placement_that_names_no_device():
    placement = choose_device(1, 0, 2)
    assert placement == DevicePlacement(slot=1, gpu=None, visible_devices=None, memory_growth=False, slots_sharing=2)
    assert choose_device(0, [], 1).visible_devices is None


@given(gpus=st.integers(1, 8), slots=st.integers(1, 24))
def test_every_gpu_carries_an_even_share_and_a_reserving_one_grows_exactly_when_shared(gpus, slots):
    assert all(choose_device(slot, gpus, slots).memory_growth for slot in range(slots))
    placements = [choose_device(slot, gpus, slots, reserve=True) for slot in range(slots)]
    per_gpu = {g: sum(p.gpu == g for p in placements) for g in {p.gpu for p in placements}}
    assert set(per_gpu.values()) <= {slots // gpus, -(-slots // gpus)}
    assert len(per_gpu) == min(gpus, slots)
    for p in placements:
        assert p.slots_sharing == per_gpu[p.gpu]
        assert p.memory_growth == (per_gpu[p.gpu] > 1)


@pytest.mark.parametrize("slot, gpus, slots, field", [
    (-1, 1, 1, "slot"),        # a negative slot
    (2, 1, 2, "slot"),         # slot >= slots
    (0, 1, 0, "MOP_SLOTS"),    # no slot at all
    (0, -1, 1, "MOP_GPUS"),    # a negative GPU count
    (0, ["0", "0"], 2, "MOP_GPUS"),  # one GPU listed twice
    (0, ["0", ""], 2, "MOP_GPUS"),   # an empty id
])
def test_bad_input_names_the_field_the_value_and_the_fix(slot, gpus, slots, field):
    with pytest.raises(SpecError) as raised:
        choose_device(slot, gpus, slots)
    message = str(raised.value)
    assert raised.value.field == field and message.startswith(f"{field}=")
    assert "Fix: " in message and raised.value.fix and raised.value.rule


# --- reading the worker's environment --------------------------------------------------------------

@pytest.mark.parametrize("environ, gpus", [
    ({}, None),
    ({"MOP_GPUS": "0"}, None),
    ({"MOP_GPUS": "0", "CUDA_VISIBLE_DEVICES": "1"}, None),   # an explicit 0 switches placement off
    ({"CUDA_VISIBLE_DEVICES": ""}, None),
    ({"CUDA_VISIBLE_DEVICES": "-1"}, None),                    # CUDA's way of hiding every GPU
    ({"MOP_GPUS": "2"}, ["0", "1"]),
    ({"MOP_GPUS": "2,3"}, ["2", "3"]),
    ({"CUDA_VISIBLE_DEVICES": "2,3"}, ["2", "3"]),
    ({"CUDA_VISIBLE_DEVICES": "2,3", "MOP_GPUS": "1"}, ["2"]),  # a count takes the first visible ones
    ({"CUDA_VISIBLE_DEVICES": "2,3", "MOP_GPUS": "3,2"}, ["3", "2"]),
    ({"CUDA_VISIBLE_DEVICES": "1,-1,2"}, ["1"]),               # CUDA stops at the first invalid id
])
def test_gpus_from_env(environ, gpus):
    assert gpus_from_env(environ) == gpus


@pytest.mark.parametrize("environ, rule", [
    ({"MOP_GPUS": "two"}, "must be a count"),
    ({"MOP_GPUS": "-1"}, "between 0 and"),
    ({"MOP_GPUS": "3", "CUDA_VISIBLE_DEVICES": "2,3"}, "between 0 and the visible GPUs (2)"),
    ({"MOP_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "2,3"}, "outside CUDA_VISIBLE_DEVICES=2,3: 0,1"),
])
def test_a_bad_gpu_setting_is_a_spec_error_naming_mop_gpus(environ, rule):
    with pytest.raises(SpecError, match="^MOP_GPUS=") as raised:
        gpus_from_env(environ)
    assert rule in raised.value.rule and "MOP_GPUS" in raised.value.fix


def test_slots_come_from_mop_slots_then_the_worker_concurrency_then_the_gpus():
    assert slots_from_env({"MOP_SLOTS": "3", "MOP_HOPS_PER_WORKER": "5"}, 2) == 3
    assert slots_from_env({"MOP_HOPS_PER_WORKER": "5", "AIRFLOW__CELERY__WORKER_CONCURRENCY": "4"}, 2) == 5
    assert slots_from_env({"AIRFLOW__CELERY__WORKER_CONCURRENCY": "4"}, 2) == 4
    assert slots_from_env({}, 2) == 2
    for bad in ("0", "x", "-2"):
        with pytest.raises(SpecError, match=f"^MOP_SLOTS='{bad}': must be a whole number"):
            slots_from_env({"MOP_SLOTS": bad}, 1)


def test_workers_dividing_different_gpus_lock_in_different_folders():
    assert default_lock_dir(["0", "1"]) != default_lock_dir(["2", "3"])
    assert default_lock_dir(["0", "1"]) == default_lock_dir(["0", "1"])
    assert Path(default_lock_dir(["GPU-1a/2"])).name == "gpus-GPU_1a_2"  # a UUID or MIG id stays one name


# --- the slot claim -----------------------------------------------------------------------------------

def hold_slot_in_child(lock_dir: Path, slots: int) -> tuple[subprocess.Popen, int]:
    """A separate process that claims a slot, says which, and sleeps holding it."""
    code = ("import sys, time; from mop_airflow.training.devices import claim_slot; "
            f"c = claim_slot({slots}, {str(lock_dir)!r}, wait_s=0); print(c.slot, flush=True); time.sleep(120)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    return child, int(child.stdout.readline())


def test_two_claims_get_different_slots_and_a_released_slot_is_taken_again(tmp_path):
    first, second = claim_slot(2, str(tmp_path)), claim_slot(2, str(tmp_path))
    assert (first.slot, second.slot) == (0, 1)
    assert Path(first.path).name == "slot-0.lock" and Path(second.path).parent == tmp_path
    first.release()
    again = claim_slot(2, str(tmp_path), wait_s=0)
    assert again.slot == 0
    again.release()
    second.release()


def test_a_slot_held_by_another_process_is_skipped_and_freed_when_it_is_killed(tmp_path):
    child, held = hold_slot_in_child(tmp_path, 2)
    try:
        assert held == 0
        mine = claim_slot(2, str(tmp_path), wait_s=0)
        assert mine.slot == 1
        with pytest.raises(SpecError, match="^MOP_SLOTS=2: all 2 slots .* held by live processes") as raised:
            claim_slot(2, str(tmp_path), wait_s=0)
        assert "--concurrency" in raised.value.fix and "pools sync --slots" in raised.value.fix
    finally:
        child.send_signal(signal.SIGKILL)  # no cleanup runs: the kernel alone drops the lock
        child.wait(timeout=10)
    assert child.returncode == -signal.SIGKILL
    freed = claim_slot(2, str(tmp_path), wait_s=0)
    assert freed.slot == 0
    freed.release()
    mine.release()


def test_a_claim_waits_for_a_slot_that_frees_within_the_wait(tmp_path):
    child, held = hold_slot_in_child(tmp_path, 1)
    assert held == 0
    threading.Timer(0.5, child.send_signal, args=(signal.SIGKILL,)).start()
    started = time.monotonic()
    claim = claim_slot(1, str(tmp_path), wait_s=20, poll_s=0.05)
    waited = time.monotonic() - started
    child.wait(timeout=10)
    assert claim.slot == 0 and 0.4 <= waited < 10
    claim.release()


def test_a_lock_folder_that_cannot_be_written_names_mop_slot_lock_dir(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(SpecError, match="^MOP_SLOT_LOCK_DIR=") as raised:
        claim_slot(1, str(blocker / "locks"))
    assert "cannot write a lock file there" in raised.value.rule


# --- applying a placement --------------------------------------------------------------------------

def test_applying_a_placement_sets_only_the_gpu_variables():
    environ = {"PATH": "/bin"}
    assert apply_placement(choose_device(1, 2, 2, reserve=True), environ) == {"CUDA_VISIBLE_DEVICES": "1"}
    assert environ == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "1"}
    shared = {}
    growth = {"CUDA_VISIBLE_DEVICES": "0", "TF_FORCE_GPU_ALLOW_GROWTH": "true", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    assert apply_placement(choose_device(1, 1, 2), shared) == growth
    assert shared == growth


def test_a_cpu_placement_changes_nothing():
    environ = {"PATH": "/bin"}
    assert apply_placement(choose_device(0, 0, 1), environ) == {}
    assert environ == {"PATH": "/bin"}


@pytest.mark.parametrize("environ", [{}, {"MOP_GPUS": "0"}, {"CUDA_VISIBLE_DEVICES": ""},
                                     {"MOP_GPUS": "0", "CUDA_VISIBLE_DEVICES": "3", "MOP_SLOTS": "4"}])
def test_a_cpu_machine_is_left_exactly_as_it_was(environ, tmp_path):
    locks = tmp_path / "locks"
    environ = {**environ, "MOP_SLOT_LOCK_DIR": str(locks)}
    before = dict(environ)
    assert place_this_process(environ) is None
    assert environ == before
    assert not locks.exists()  # not even a lock file


def test_place_this_process_gives_each_process_its_own_gpu(tmp_path):
    base = {"MOP_GPUS": "2", "MOP_SLOTS": "2", "MOP_SLOT_LOCK_DIR": str(tmp_path), "MOP_SLOT_WAIT_SECONDS": "0",
            "MOP_GPU_RESERVE": "1"}
    first, second = dict(base), dict(base)
    assert place_this_process(first).gpu == "0"
    assert place_this_process(second).gpu == "1"
    assert (first["CUDA_VISIBLE_DEVICES"], second["CUDA_VISIBLE_DEVICES"]) == ("0", "1")
    assert not {"TF_FORCE_GPU_ALLOW_GROWTH", "XLA_PYTHON_CLIENT_PREALLOCATE"} & {*first, *second}
    third = dict(base)
    with pytest.raises(SpecError, match="^MOP_SLOTS=2: all 2 slots"):
        place_this_process(third)
    assert third == base


def test_place_this_process_on_a_preset_cuda_list_with_more_slots_than_gpus(tmp_path):
    environ = {"CUDA_VISIBLE_DEVICES": "2,3", "MOP_SLOTS": "3", "MOP_SLOT_LOCK_DIR": str(tmp_path)}
    placement = place_this_process(environ)
    assert (placement.slot, placement.gpu, placement.slots_sharing) == (0, "2", 2)
    assert environ["CUDA_VISIBLE_DEVICES"] == "2" and environ["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"


def test_a_lone_slot_grows_memory_by_default_and_a_bad_reserve_flag_names_its_variable(tmp_path):
    environ = {"MOP_GPUS": "1", "MOP_SLOTS": "1", "MOP_SLOT_LOCK_DIR": str(tmp_path / "a")}
    assert place_this_process(environ).memory_growth is True
    assert environ["TF_FORCE_GPU_ALLOW_GROWTH"] == "true" and environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    bad = {"MOP_GPUS": "1", "MOP_SLOT_LOCK_DIR": str(tmp_path / "b"), "MOP_GPU_RESERVE": "always"}
    with pytest.raises(SpecError, match="^MOP_GPU_RESERVE='always': must be 1 or 0"):
        place_this_process(bad)


def test_a_bad_wait_names_mop_slot_wait_s(tmp_path):
    environ = {"MOP_GPUS": "1", "MOP_SLOT_LOCK_DIR": str(tmp_path), "MOP_SLOT_WAIT_SECONDS": "soon"}
    with pytest.raises(SpecError, match="^MOP_SLOT_WAIT_SECONDS='soon': must be a number of seconds"):
        place_this_process(environ)


def test_backend_started_reads_tensorflow_and_jax_state_without_importing_either():
    def modules(ctx):
        return {"tensorflow.python.eager.context": SimpleNamespace(context_safe=lambda: ctx)}

    assert backend_started({}) is False                                     # never imported
    assert backend_started(modules(None)) is False                          # imported (the preload)
    assert backend_started(modules(SimpleNamespace(_initialized=False, _physical_devices=[1]))) is True
    assert backend_started(modules(SimpleNamespace(_initialized=True, _physical_devices=None))) is True
    assert backend_started(modules(SimpleNamespace())) is False             # internals moved
    # JAX: its bridge module holds the backends it started (none until the first device query or op)
    assert backend_started({"jax._src.xla_bridge": SimpleNamespace(_backends={})}) is False
    assert backend_started({"jax._src.xla_bridge": SimpleNamespace(_backends={"cuda": object()})}) is True