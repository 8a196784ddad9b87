"""Sampling distributions: formulas checked with a stream whose draws are known, bounds and grids
with real streams, validation messages, and one stream per hyperparameter."""

import math
import random

import pytest

from mop_airflow.errors import SpecError
from mop_airflow.search.distributions import Distribution, parse_distribution
from mop_airflow.search.space import SearchSpace


class Fixed:
    """A stream whose uniform(a, b) is a + f * (b - a) for the next f given (as random.uniform)."""

    def __init__(self, *fractions):
        self.fractions = list(fractions)

    def uniform(self, a, b):
        return a + self.fractions.pop(0) * (b - a)


def parse(**spec):
    return parse_distribution("search.space.params.hparams.x", spec)


def draws(dist, *fractions):
    rng = Fixed(*fractions)
    return [dist.sample(rng) for _ in fractions]


def test_quantized_uniform_rounds_to_multiples_of_q_and_clips_onto_the_grid():
    dist = parse(distribution="quantized_uniform", low=0.0, high=1.0, q=0.25)
    assert draws(dist, 0.3, 0.0, 1.0, 0.6) == [0.25, 0.0, 1.0, 0.5]
    # low/high off the grid: 0.1 -> round(0.4)=0 is clipped to 0.25, 0.9 -> round(3.6)=4 to 0.75.
    clipped = parse(distribution="quantized_uniform", low=0.1, high=0.9, q=0.25)
    assert draws(clipped, 0.0, 1.0, 0.5) == [0.25, 0.75, 0.5]


def test_quantized_values_are_exact_decimals_and_ints_for_int_specs():
    tenths = parse(distribution="quantized_uniform", low=0.0, high=1.0, q=0.1)
    assert draws(tenths, 0.3) == [0.3]  # 3 * 0.1 would be 0.30000000000000004
    batch = parse(distribution="quantized_uniform", low=16, high=256, q=16)
    values = draws(batch, 0.0, 1.0, 0.5)
    assert values == [16, 256, 128] and all(type(v) is int for v in values)


def test_quantized_log_uniform():
    units = parse(distribution="quantized_log_uniform", low=1, high=1024, q=16)
    # exp(0.5 * log 1024) = 32; exp(0) = 1 rounds to 0 and is clipped to 16; 1024 stays.
    assert draws(units, 0.5, 0.0, 1.0) == [32, 16, 1024]
    lr = parse(distribution="quantized_log_uniform", low=1e-4, high=1e-2, q=1e-4)
    assert draws(lr, 0.5) == [0.001]


def test_log_near_one_matches_madlib():
    # MADlib: 1 - 10**uniform(log10(1 - high), log10(1 - low)); here u in [-3, -1].
    dist = parse(distribution="log_near_one", low=0.9, high=0.999)
    got = draws(dist, 0.0, 0.5, 1.0)
    assert got == pytest.approx([0.999, 0.99, 0.9])
    assert parse(distribution="log_near_one", low=0.0, high=0.9).sample(Fixed(1.0)) == pytest.approx(0.0)


@pytest.mark.parametrize("spec,check", [
    ({"distribution": "quantized_uniform", "low": 0.05, "high": 0.5, "q": 0.05},
     lambda v: 0.05 <= v <= 0.5 and abs(v / 0.05 - round(v / 0.05)) < 1e-9),
    ({"distribution": "quantized_uniform", "low": 10, "high": 100, "q": 7},
     lambda v: type(v) is int and 14 <= v <= 98 and v % 7 == 0),
    ({"distribution": "quantized_log_uniform", "low": 8, "high": 512, "q": 8},
     lambda v: type(v) is int and 8 <= v <= 512 and v % 8 == 0),
    ({"distribution": "log_near_one", "low": 0.5, "high": 0.9999}, lambda v: 0.5 <= v <= 0.9999),
])
def test_real_draws_stay_in_range_and_on_the_grid(spec, check):
    dist = parse(**spec)
    rng = random.Random(11)
    values = [dist.sample(rng) for _ in range(500)]
    assert all(check(v) for v in values)
    assert len(set(values)) > 5


def test_log_near_one_spreads_over_orders_of_magnitude():
    dist = parse(distribution="log_near_one", low=0.9, high=0.999)
    rng = random.Random(3)
    values = [dist.sample(rng) for _ in range(2000)]
    below = sum(v < 0.99 for v in values) / len(values)  # 0.99 is the median: u = -2 halves [-3, -1]
    assert 0.45 < below < 0.55


def test_existing_distributions_are_unchanged():
    rng, ref = random.Random(5), random.Random(5)
    assert parse(distribution="uniform", low=0.1, high=0.2).sample(rng) == ref.uniform(0.1, 0.2)
    assert parse(distribution="log_uniform", low=1e-4, high=1e-2).sample(rng) == math.exp(
        ref.uniform(math.log(1e-4), math.log(1e-2)))
    assert parse(distribution="int_uniform", low=1, high=9).sample(rng) == ref.randint(1, 9)
    assert parse(distribution="choice", values=["a", "b", "c"]).sample(rng) == ["a", "b", "c"][ref.randrange(3)]
    assert parse(distribution="uniform", low=0, high=1) == Distribution("uniform", low=0.0, high=1.0)


ALL_KINDS = [
    {"distribution": "uniform", "low": 0.0, "high": 1.0},
    {"distribution": "log_uniform", "low": 1e-4, "high": 1.0},
    {"distribution": "int_uniform", "low": 0, "high": 1000},
    {"distribution": "quantized_uniform", "low": 0.0, "high": 1.0, "q": 0.01},
    {"distribution": "quantized_log_uniform", "low": 1, "high": 4096, "q": 1},
    {"distribution": "log_near_one", "low": 0.0, "high": 0.9999},
    {"distribution": "choice", "values": list(range(20))},
]


@pytest.mark.parametrize("spec", ALL_KINDS, ids=[k["distribution"] for k in ALL_KINDS])
def test_two_hyperparameters_with_the_same_range_get_different_draws(spec):
    space = SearchSpace({"model": "my_models:cnn", "hparams": {"a": dict(spec), "b": dict(spec)}},
                        method="random", num_samples=8, seed=0)
    configs = space.expand()
    a = [c["hparams"]["a"] for c in configs]
    b = [c["hparams"]["b"] for c in configs]
    assert a != b
    assert sum(x != y for x, y in zip(a, b)) >= 6  # not one coincidence: the streams are independent
    assert space.expand() == configs  # and seeded


@pytest.mark.parametrize("spec,field,words", [
    ({"distribution": "quantized_uniform", "low": 0, "high": 1}, "x.q", "needs a step q"),
    ({"distribution": "quantized_uniform", "low": 0, "high": 1, "q": 0}, "x.q", "must be > 0"),
    ({"distribution": "quantized_uniform", "low": 0, "high": 1, "q": -0.5}, "x.q", "must be > 0"),
    ({"distribution": "quantized_uniform", "low": 0, "high": 1, "q": "0.1"}, "x.q", "finite number"),
    ({"distribution": "quantized_uniform", "low": 0, "high": 1, "q": float("inf")}, "x.q", "finite number"),
    ({"distribution": "quantized_uniform", "low": 0.1, "high": 0.4, "q": 0.5}, "x.q", "fewer than two multiples"),
    ({"distribution": "quantized_uniform", "low": 1, "high": 1, "q": 0.5}, "x.low", "must be below high"),
    ({"distribution": "quantized_log_uniform", "low": 0, "high": 64, "q": 8}, "x.low", "log range needs low > 0"),
    ({"distribution": "log_near_one", "low": -0.1, "high": 0.9}, "x.low", "0 <= low < high < 1"),
    ({"distribution": "log_near_one", "low": 0.9, "high": 1.0}, "x.high", "high < 1"),
    ({"distribution": "log_near_one", "low": 0.99, "high": 0.9}, "x.low", "must be below high"),
    ({"distribution": "uniform", "low": 0, "high": 1, "q": 0.1}, "x.q", "only applies to"),
    ({"distribution": "normal", "low": 0, "high": 1}, "x.distribution", "must be one of"),
])
def test_bad_distributions_are_named(spec, field, words):
    with pytest.raises(SpecError) as err:
        parse_distribution("x", spec)
    assert err.value.field == field and words in err.value.rule and err.value.fix


def test_errors_surface_through_the_search_space():
    with pytest.raises(SpecError, match=r"search\.space\.params\.hparams\.momentum\.high"):
        SearchSpace({"model": "m:f", "hparams": {"momentum": {"distribution": "log_near_one", "low": 0.5, "high": 1}}},
                    method="random", num_samples=2)
