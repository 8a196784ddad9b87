"""`mop-airflow plan` prints the schedule before anything runs; bad input exits 2 with the rule."""

from mop_airflow.cli.main import main


def test_plan_prints_brackets_totals_and_estimate(capsys):
    assert main(["plan", "--R", "9", "--eta", "3", "--shards", "4", "--seconds-per-hop", "2"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit() and len(line.split()) == 6]
    # (bracket, rung, configs, iterations, hops, keep) for R=9, eta=3 on 4 shards
    assert rows == [["2", "0", "9", "1", "4", "3"], ["2", "1", "3", "3", "12", "1"], ["2", "2", "1", "9", "36", "-"],
                    ["1", "0", "5", "3", "12", "1"], ["1", "1", "1", "9", "36", "-"], ["0", "0", "3", "9", "36", "-"]]
    assert "total configurations: 17" in out
    assert "69 iterations = 276 model-hops" in out
    assert "estimated wall time: at least 138 s" in out  # 276 hops x 2 s / 4 shards
    # the replay of the DAG's task plan: just above the bound (rung barriers), never below it
    assert "simulated wall time: 140 s" in out


def test_successive_halving_plan(capsys):
    assert main(["plan", "--n", "8", "--r", "1", "--eta", "2", "--shards", "2"]) == 0
    out = capsys.readouterr().out
    assert "total configurations: 8" in out


def test_plan_rejects_rungs_between_iterations(capsys):
    assert main(["plan", "--R", "4", "--eta", "3"]) == 2
    assert "not a whole number of iterations" in capsys.readouterr().err
