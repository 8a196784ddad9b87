"""Model-based proposals (mop_airflow.search.tpe): Optuna's TPE rebuilt from our records, seeded."""

import math
import statistics

import pytest

from mop_airflow.errors import SpecError
from mop_airflow.search.jobs import Completion
from mop_airflow.search.space import SearchSpace, config_id
from mop_airflow.search.tpe import proposer

PARAMS = {"model": ["m:mlp", "m:cnn"],
          "learning_rate": {"distribution": "log_uniform", "low": 1e-5, "high": 1e-1},
          "batch_size": {"distribution": "quantized_uniform", "low": 16, "high": 128, "q": 16},
          "hparams": {"dropout": {"distribution": "quantized_uniform", "low": 0.0, "high": 0.5, "q": 0.1},
                      "momentum": {"distribution": "log_near_one", "low": 0.9, "high": 0.999},
                      "units": {"distribution": "int_uniform", "low": 8, "high": 64}}}


def space(**kw):
    return SearchSpace.from_dict({"method": "random", "seed": 4, "num_samples": 40, "sampler": "tpe", "params": PARAMS,
                                  **kw})


def score(config):
    """Best at a learning rate of 1e-3 and the CNN: what a model of the results can find."""
    lr = config["optimizer_params"]["learning_rate"]
    return -abs(math.log10(lr) + 3) - (0.5 if config["model"] == "m:mlp" else 0.0)


def ask(s, configs, completions, n, block=1, running=()):
    made = []
    propose = proposer(s, configs, completions, running, top_rung=0, direction="max", block=block,
                       default_epochs_per_hop=1, new_id=lambda c: config_id(len(configs) + len(made), c))
    for _ in range(n):
        made.append(propose())
    return made


def test_proposals_are_in_the_space_seeded_by_the_records_and_move_towards_the_better_results():
    s = space()
    drawn = s.expand(count=20)
    done = [Completion(c["config_id"], 0, score(c)) for c in drawn]
    made = ask(s, drawn, done, 10)
    assert made == ask(s, drawn, done, 10)  # the same records, the same proposals
    assert made != ask(s, drawn, done, 10, block=2)
    assert len({c["config_id"] for c in made}) == 10 and all(c["config_id"].startswith(("c02", "c03")) for c in made)
    for c in made:
        assert 1e-5 <= c["optimizer_params"]["learning_rate"] <= 1e-1 and c["batch_size"] % 16 == 0
        assert c["hparams"]["dropout"] in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5) and 8 <= c["hparams"]["units"] <= 64
        assert 0.9 <= c["hparams"]["momentum"] <= 0.999 and isinstance(c["batch_size"], int)
        assert set(c) == set(drawn[0])
    proposed = statistics.median(score(c) for c in made)
    random = statistics.median(score(c) for c in s.expand(count=30)[20:])
    assert proposed > random + 0.5  # the model found the region of the best results


def test_pruned_running_and_failed_configurations_are_read_from_the_records():
    s = space()
    drawn = s.expand(count=6)
    done = [Completion(drawn[0]["config_id"], 0, 0.9), Completion(drawn[1]["config_id"], 0, None, "failed"),
            Completion(drawn[2]["config_id"], 0, 0.4)]
    propose = proposer(s, drawn, done, [drawn[3]["config_id"]], top_rung=2, direction="max", block=1,
                       default_epochs_per_hop=1, new_id=lambda c: "x")
    assert propose()["config_id"] == "x"  # rung 0 of 3: pruned trials, one running, two never started


def test_tpe_is_refused_where_it_cannot_propose():
    with pytest.raises(SpecError, match="search.space.sampler='grid'|must be one of"):
        space(sampler="grid")
    with pytest.raises(SpecError, match="random search only"):
        SearchSpace.from_dict({"method": "grid", "sampler": "tpe", "params": {"model": ["m:a"]}})
    with pytest.raises(SpecError, match="startup=0"):
        space(startup=0)
