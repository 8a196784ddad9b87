"""The results page on a real Airflow (api-server, scheduler, dag-processor) in a real headless Chromium.

Airflow runs with the FAB auth manager, whose roles can be limited to one DAG: an admin, a user
whose role may read the MOP DAG's runs, and one whose role may read only another DAG. A tiny MOP
DAG (3 configurations, 2 shards, 2 iterations) is triggered once; the admin's browser opens its
page at once and watches it refresh from "waiting for preflight" through training (a provisional
leaderboard) to the report, then checks the finished page inside Airflow's own UI: leaderboard
rows against the report, the learning curves, the hop timeline against the hop records, the plan
against plan.json, and a download from the tab. Without a token the API answers 401, with another
DAG's rights 403, and no path reaches outside the run's report folder.
"""

import http.client
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse

import httpx
import pytest

from mop_airflow.deployment.local import LocalAirflow
from mop_airflow.records.layout import RunLayout
from mop_airflow.store import Store
from tests.conftest import dag_file
from tests.test_end_to_end import tiny_spec, write_digits

pytestmark = pytest.mark.integration

DAG_ID, OTHER_DAG, GROUPS_DAG = "mop_results_page", "plain_other", "mop_groups"
USERS = {"admin": "Admin", "reader": "mop_reader", "other": "other_reader"}
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
FAB = "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"
OTHER_DAG_FILE = """from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

with DAG("plain_other", schedule=None):
    EmptyOperator(task_id="noop")
"""
# A DAG holding two model selections in task groups, each preflight standing in for a MopTaskGroup's:
# it returns the run record its group's tasks wrote to the store (the test writes them beforehand).
GROUPS_DAG_FILE = """import json, os
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, BaseOperator, TaskGroup


class MopPreflightOperator(BaseOperator):
    def execute(self, context):
        group = self.task_id.rsplit(".", 1)[0]
        path = os.path.join(os.environ["MOP_GROUPS_STORE"], f"mop_groups.{group}", context["run_id"], "run.json")
        with open(path) as f:
            return json.load(f)


with DAG("mop_groups", schedule=None):
    extract = EmptyOperator(task_id="extract")
    for group in ("model_selection", "challenger"):
        with TaskGroup(group):
            extract >> MopPreflightOperator(task_id="preflight")
"""


def password(user):
    return f"pw-{user}-0"


class Api:
    """The REST API and the plugin's routes with each user's token (FAB: POST /auth/token)."""

    def __init__(self, base_url):
        self.base_url = base_url
        self.client = httpx.Client(base_url=base_url, timeout=60.0)
        self.tokens = {}

    def fresh(self, path, **kwargs):
        """A request from a new client: no cookie or header but those given."""
        return httpx.get(self.base_url + path, timeout=60.0, **kwargs)

    def token(self, user):
        if user not in self.tokens:
            response = self.client.post("/auth/token", json={"username": user, "password": password(user)})
            response.raise_for_status()
            self.tokens[user] = response.json()["access_token"]
        return self.tokens[user]

    def get(self, path, user="admin", **kwargs):
        if user is None:
            return self.fresh(path, **kwargs)
        return self.client.get(path, headers={"Authorization": f"Bearer {self.token(user)}"}, **kwargs)

    def call(self, method, path, user="admin", **kwargs):
        response = self.client.request(method, f"/api/v2{path}", headers={"Authorization": f"Bearer {self.token(user)}"},
                                       **kwargs)
        assert response.status_code < 400, f"{method} {path} -> {response.status_code}: {response.text[:500]}"
        return response.json()

    def trigger(self, dag_id):
        self.call("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
        return self.call("POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": None})["dag_run_id"]

    def wait_for_run(self, dag_id, run_id, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            state = self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"]
            if state in ("success", "failed"):
                return state
            time.sleep(2)
        raise TimeoutError(f"{dag_id} {run_id} did not finish in {timeout} s")


# Airflow's own command line, several commands in one process: its main() parses each and calls the
# command. One process for six commands instead of six: each `airflow` process spent 5-10 s importing.
CLI_BATCH = """
import json, sys
from airflow import configuration  # first, as airflow's __main__ imports it: no import cycles
from airflow.cli import cli_parser
from airflow.cli.utils import redirect_stdout_log_handlers_to_stderr
parser = cli_parser.get_parser()
for argv in json.loads(sys.argv[1]):
    print("airflow", *argv, file=sys.stderr, flush=True)
    args = parser.parse_args(argv)
    if hasattr(args, "output"):  # as airflow's main(): the log stays out of structured output
        redirect_stdout_log_handlers_to_stderr()
    args.func(args)
"""


def user_create(user):
    return ["users", "create", "--username", user, "--password", password(user), "--role", USERS[user],
            "--firstname", user, "--lastname", "User", "--email", f"{user}@example.org"]


def cli(af, *commands):
    """Run each of ``commands`` (each a list of arguments of `airflow`) in one process, in order."""
    result = subprocess.run([sys.executable, "-c", CLI_BATCH, json.dumps(list(commands))], env=af.env,
                            capture_output=True, text=True)
    assert result.returncode == 0, f"{commands}: {result.stdout[-2000:]} {result.stderr[-2000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    root = tmp_path_factory.mktemp("results_page")
    dags = root / "dags"
    dags.mkdir()
    write_digits(root / "digits.parquet")
    # 3 configurations x 2 shards x 2 iterations; 60 passes a hop, so that the warm train tasks, which make
    # a pass of this tiny model a few hundredths of a second, train long enough for the page (which
    # refreshes every 5 s) to be seen while hops train
    spec = tiny_spec(root / "digits.parquet", f"file://{root / 'store'}", epochs_per_hop=60)
    dag_file(dags, DAG_ID, spec, pools="off")
    (dags / f"{OTHER_DAG}.py").write_text(OTHER_DAG_FILE)
    (dags / f"{GROUPS_DAG}.py").write_text(GROUPS_DAG_FILE)
    env = {"MOP_HOME": str(root / "mop"), "AIRFLOW__CORE__AUTH_MANAGER": FAB,
           "MOP_GROUPS_STORE": str(root / "store"),
           "AIRFLOW__API__SECRET_KEY": "results-page-test", "AIRFLOW__API__WORKERS": "1"}
    with LocalAirflow(root / "airflow", dags, extra_env=env) as af:
        cli(af, user_create("admin"))
        api = Api(af.base_url)
        for shard in (0, 1):  # the pools exist before the run (the DAG's preflight does not touch them)
            api.call("POST", "/pools", json={"name": f"mop_shard_{shard}", "slots": 1, "description": f"shard {shard}"})
        deadline = time.time() + 180
        while any(api.get(f"/api/v2/dags/{dag}").status_code != 200 for dag in (DAG_ID, OTHER_DAG, GROUPS_DAG)):
            assert time.time() < deadline, "the DAGs were not parsed in time"
            assert not api.call("GET", "/importErrors")["import_errors"]
            time.sleep(1)
        # FAB's per-DAG resources exist once the DAGs are synced; then a role can be limited to one DAG
        cli(af, ["sync-perm", "--include-dags"],
            ["roles", "create", "mop_reader", "other_reader"],
            ["roles", "add-perms", "mop_reader", "-a", "can_read", "-r", f"DAG:{DAG_ID}", "DAG Runs"],
            ["roles", "add-perms", "other_reader", "-a", "can_read", "-r", f"DAG:{OTHER_DAG}", "DAG Runs"],
            user_create("reader"), user_create("other"))
        af.root, af.rest_api = root, api
        yield af
        api.client.close()


@pytest.fixture(scope="module")
def run_id(airflow):
    """The MOP run, triggered (not waited for: the first test watches it)."""
    return airflow.rest_api.trigger(DAG_ID)


@pytest.fixture(scope="module")
def finished(airflow, run_id):
    assert airflow.rest_api.wait_for_run(DAG_ID, run_id, timeout=600) == "success"
    store = Store(f"file://{airflow.root / 'store'}")
    return RunLayout(store, DAG_ID, run_id)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        # CI installs it and must run these tests: there a missing browser is a failure, not a skip
        if os.environ.get("MOP_REQUIRE_BROWSER"):
            pytest.fail("no chromium on PATH although MOP_REQUIRE_BROWSER is set: install Debian's chromium")
        pytest.skip("no chromium on PATH (install Debian's chromium; .ci/run does)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


# Playwright storage states (cookies) of the logins done, by Airflow and user: a browser logs in through FAB's
# form once and later tests start from its cookies, as a user's browser would. FAB allows one address 5
# logins in 40 s ([fab] auth_rate_limit, on by default) and answers the sixth 429: seven tests that each
# logged in anew failed when CI ran six of them within 40 s.
LOGINS = {}


def logged_in(browser, airflow, user="admin"):
    """A page of a new browser context logged in as user (FAB's _token cookie set by its login form)."""
    options = {"viewport": {"width": 1280, "height": 900}, "accept_downloads": True}
    if (airflow.base_url, user) in LOGINS:
        return browser.new_context(storage_state=LOGINS[airflow.base_url, user], **options).new_page()
    context = browser.new_context(**options)
    page = context.new_page()
    page.goto(f"{airflow.base_url}/auth/login/")
    page.fill("#username", user)
    page.fill("#password", password(user))
    # The click submits the form; waiting for "networkidle" right after it can return before the
    # POST has even started (the login page itself is idle), so wait for the cookie the answer sets.
    page.click("input[type=submit], button[type=submit]")
    deadline = time.monotonic() + 60
    while "_token" not in {c["name"] for c in context.cookies()}:
        assert time.monotonic() < deadline, (f"logging in as {user} set no _token cookie within 60 s (at {page.url}, "
                                             f"which says {page.inner_text('body')[:300]!r})")
        page.wait_for_timeout(200)
    page.wait_for_load_state("networkidle")
    LOGINS[airflow.base_url, user] = context.storage_state()
    return page


def quoted(run_id):
    return urllib.parse.quote(run_id, safe="")


SNAPSHOT = """() => {
  const q = (s) => Array.from(document.querySelectorAll(s));
  return {
    stage: document.body.dataset.stage, stages: window.mopStages || [],
    message: document.getElementById("message").textContent,
    progress: document.getElementById("progress-text").textContent,
    note: document.getElementById("leaderboard-note").textContent,
    rows: q("#leaderboard tbody tr").map((tr) => ({config_id: tr.dataset.configId, status: tr.dataset.status,
      cells: Array.from(tr.cells).map((td) => td.textContent)})),
  };
}"""


@pytest.mark.slow
def test_the_page_follows_the_run_from_preflight_through_training_to_the_report(airflow, browser, run_id, tmp_path):
    page = logged_in(browser, airflow)
    page.goto(f"{airflow.base_url}/mop/runs/{DAG_ID}/{quoted(run_id)}")
    page.wait_for_function("() => document.body.dataset.stage !== undefined", timeout=60_000)
    first = page.evaluate(SNAPSHOT)
    assert first["stage"] in ("waiting", "resolved", "planned", "training"), first  # opened before the run ended
    if first["stage"] == "waiting":
        assert "preflight has not finished yet" in first["message"]

    # one consistent snapshot taken while hops train: a provisional leaderboard and partial progress
    training = page.wait_for_function(f"() => document.body.dataset.stage === 'training' && ({SNAPSHOT})()",
                                      timeout=400_000, polling=200).json_value()
    page.screenshot(path=str(tmp_path / "results_page_training.png"), full_page=True)
    assert training["note"].startswith("Provisional")
    assert len(training["rows"]) == 3
    done, total = map(int, training["progress"].split("Model hops ")[1].split(" \u00b7")[0].split(" / "))
    # the stage turns to reporting once the train tasks end: the last hop may be committed just before
    assert total == 12 and 0 <= done <= 12
    assert {row["status"] for row in training["rows"]} <= {"training", "waiting", "finished"}

    final = page.wait_for_function(f"() => document.body.dataset.stage === 'reported' && ({SNAPSHOT})()",
                                   timeout=400_000, polling=500).json_value()
    assert final["note"].startswith("Final, from the run's report")
    assert "Model hops 12 / 12" in final["progress"]
    # the page refreshed itself: no reload, several renders, the stages in the order the run went
    order = ["waiting", "resolved", "planned", "training", "reported"]
    seen = [order.index(stage) for stage in final["stages"]]
    assert seen == sorted(seen) and len(set(seen)) >= 2 and "training" in final["stages"]
    page.wait_for_function("() => document.body.dataset.runState === 'success'", timeout=120_000)
    renders = page.evaluate("window.mopStages.length")
    page.wait_for_timeout(6_000)
    assert page.evaluate("window.mopStages.length") == renders  # it stops refreshing once the run is done
    page.context.close()


def test_the_finished_run_in_the_airflow_ui_tab(airflow, browser, finished, tmp_path):
    store, run_id = finished.store, finished.run_id
    board = store.read_json(finished.report_uri("leaderboard.json"))["leaderboard"]
    plan = store.read_json(finished.plan_uri)
    hops = [store.read_json(uri) for uri in store.glob(finished.hops_glob)]
    page = logged_in(browser, airflow)
    page.goto(f"{airflow.base_url}/dags/{DAG_ID}/runs/{quoted(run_id)}/plugin/mop-results")
    frame = page.frame_locator("iframe[title='MOP results']")
    frame.locator("#leaderboard tbody tr").first.wait_for(timeout=90_000)
    frame.locator("#timeline-chart").wait_for()
    page.wait_for_timeout(500)
    page.screenshot(path=str(tmp_path / "results_tab_in_airflow_ui.png"))

    rows = frame.locator("#leaderboard tbody tr")
    assert rows.count() == 3
    for i, expected in enumerate(board):
        cells = rows.nth(i).locator("td").all_inner_texts()
        assert cells[0] == str(expected["rank"]) and cells[1].strip() == expected["config_id"]
        assert float(cells[3]) == pytest.approx(expected["val_accuracy"], abs=5e-4)
        assert cells[-1] == "finished"
        assert "mlp \u00b7 adam \u00b7 lr" in cells[2] and "units=32" in cells[2]
    assert [float(rows.nth(i).locator("td.metric").inner_text()) for i in range(3)] == \
        sorted((float(rows.nth(i).locator("td.metric").inner_text()) for i in range(3)), reverse=True)
    challenge = store.read_json(finished.report_uri("summary.json"))["challenge"]
    said = frame.locator("#champion")
    assert said.get_attribute("data-publish") == str(challenge["publish"]).lower()
    assert said.inner_text() == ("Published as the DAG's champion: " if challenge["publish"] else "Not published: ") \
        + challenge["reason"]

    for chart in ("loss", "accuracy"):  # training and validation line per configuration, a point per iteration
        svg = frame.locator(f"svg#curves-{chart}")
        assert svg.locator("polyline.train").count() == 3 and svg.locator("polyline.validation").count() == 3
        assert svg.locator("circle.point").count() == 3 * 2 * 2
    assert frame.locator("svg .stop").count() == 0  # nothing was pruned or failed

    bars = frame.locator("#timeline-chart rect.hop")
    assert bars.count() == len(hops) == 12
    drawn = sorted((bars.nth(i).get_attribute("data-config-id"), int(bars.nth(i).get_attribute("data-shard")))
                   for i in range(bars.count()))
    assert drawn == sorted((h["config_id"], h["shard"]) for h in hops)
    t0, t1 = min(h["started_at"] for h in hops), max(h["saved_at"] for h in hops)
    # a hop holds its slot until it released it (its commit may end later, beside the slot's next hop)
    busy = sum((h["released_at"] or h["saved_at"]) - h["started_at"] for h in hops) / (2 * (t1 - t0))
    assert busy <= 1.0
    assert f"Shard pools busy {100 * busy:.1f}%" in frame.locator("#busy").inner_text()
    labels = frame.locator("#timeline-chart text.shard-label").all_text_contents()
    assert [label.split(" \u00b7 ")[0] for label in labels] == ["shard 0", "shard 1"]

    plan_rows = frame.locator("#plan-configs tbody tr")
    assert plan_rows.count() == 3
    for i in range(3):
        cid = plan_rows.nth(i).get_attribute("data-config-id")
        order = plan["visit_order"][cid]
        expected = " | ".join(" \u2192 ".join(map(str, order[k:k + 2])) for k in (0, 2))
        assert plan_rows.nth(i).locator("td.order").inner_text() == expected
    assert "as recorded in plan.json" in frame.locator("#plan-note").inner_text()

    links = frame.locator("#downloads a")
    assert sorted(links.nth(i).get_attribute("data-file") for i in range(links.count())) == sorted(
        ["best_model.keras", "metrics.parquet", "metrics.json", "leaderboard.json", "summary.json",
         "hop_timeline.json", "learning_curves.png", "hop_timeline.png"])
    # the UI's iframe is sandboxed without downloads: the link starts it from the top document
    with page.expect_download(timeout=30_000) as download:
        frame.locator("a[data-file='best_model.keras']").click()
    assert download.value.suggested_filename == "best_model.keras"
    with open(download.value.path(), "rb") as handle:
        assert handle.read() == store.read_bytes(finished.report_uri("best_model.keras"))

    page.goto(f"{airflow.base_url}/mop/runs/{DAG_ID}/{quoted(run_id)}")  # the page on its own, whole
    page.locator("#timeline-chart").wait_for(timeout=60_000)
    page.screenshot(path=str(tmp_path / "results_page_finished.png"), full_page=True)
    page.context.close()


def test_the_runs_page_in_the_browse_menu_lists_the_run_and_opens_it(airflow, browser, finished, tmp_path):
    page = logged_in(browser, airflow)
    page.goto(f"{airflow.base_url}/plugin/mop-runs")
    frame = page.frame_locator("iframe[title='MOP runs']")
    row = frame.locator(f"#runs tbody tr[data-run-id='{finished.run_id}']")
    row.wait_for(timeout=90_000)
    assert row.get_attribute("data-dag-id") == DAG_ID and row.locator(".state").inner_text() == "success"
    page.screenshot(path=str(tmp_path / "runs_page.png"))
    row.locator("a").click()
    frame.locator("#leaderboard tbody tr").first.wait_for(timeout=60_000)
    assert frame.locator("#leaderboard tbody tr").count() == 3
    page.context.close()


def test_downloads_stream_the_report_files(airflow, finished):
    api, base = airflow.rest_api, f"/mop/api/runs/{DAG_ID}/{quoted(finished.run_id)}"
    response = api.get(f"{base}/files/best_model.keras")
    assert response.status_code == 200 and response.headers["content-disposition"] == \
        'attachment; filename="best_model.keras"'
    assert response.content == finished.store.read_bytes(finished.report_uri("best_model.keras"))
    metrics = api.get(f"{base}/files/metrics.json")
    assert metrics.json() == finished.store.read_json(finished.report_uri("metrics.json")) and len(metrics.json()) == 6
    parquet = api.get(f"{base}/files/metrics.parquet")
    assert parquet.status_code == 200 and parquet.content[:4] == b"PAR1"


def test_every_route_needs_an_airflow_login(airflow, finished):
    api, run = airflow.rest_api, quoted(finished.run_id)
    routes = ["/mop/", "/mop/api/runs", f"/mop/runs/{DAG_ID}/{run}", f"/mop/api/runs/{DAG_ID}/{run}",
              f"/mop/api/runs/{DAG_ID}/{run}/files/best_model.keras"]
    for route in routes:
        assert api.get(route, user=None).status_code == 401, route
        assert api.fresh(route, headers={"Authorization": "Bearer not-a-jwt"}).status_code == 403, route
        forged = api.token("admin")[:-6] + ("AAAAAA" if not api.token("admin").endswith("AAAAAA") else "BBBBBB")
        assert api.fresh(route, cookies={"_token": forged}).status_code == 403, route  # a bad signature
        assert api.fresh(route, cookies={"_token": api.token("admin")}).status_code == 200, route  # the UI's way
    assert api.get("/mop/static/results.js", user=None).status_code == 200  # code, not data
    assert api.get("/mop/static/run.html", user=None).status_code == 404


def test_a_user_may_see_only_runs_of_dags_their_role_can_read(airflow, finished):
    api, run = airflow.rest_api, quoted(finished.run_id)
    data = api.get(f"/mop/api/runs/{DAG_ID}/{run}", user="reader")
    assert data.status_code == 200 and data.json()["stage"] == "reported"
    assert [r["run_id"] for r in api.get("/mop/api/runs", user="reader").json()["runs"]] == [finished.run_id]
    assert api.get(f"/mop/api/runs/{DAG_ID}/{run}/files/metrics.json", user="reader").status_code == 200

    for route in (f"/mop/runs/{DAG_ID}/{run}", f"/mop/api/runs/{DAG_ID}/{run}",
                  f"/mop/api/runs/{DAG_ID}/{run}/files/best_model.keras"):
        response = api.get(route, user="other")
        assert response.status_code == 403 and response.json() == {"detail": "Forbidden"}, route
    assert api.get("/mop/api/runs", user="other").json() == {"runs": []}
    # the same users on Airflow's own API agree: these are the auth manager's rights, not ours
    assert api.client.get(f"/api/v2/dags/{DAG_ID}/dagRuns",
                          headers={"Authorization": f"Bearer {api.token('other')}"}).status_code == 403


def test_a_run_of_a_dag_that_is_not_a_mop_dag_has_no_results(airflow):
    api = airflow.rest_api
    other_run = api.trigger(OTHER_DAG)
    response = api.get(f"/mop/api/runs/{OTHER_DAG}/{quoted(other_run)}", user="other")
    assert response.status_code == 404 and "not a mop_airflow DAG" in response.json()["detail"]
    assert api.get(f"/mop/api/runs/{DAG_ID}/no-such-run").status_code == 404


def raw_get(airflow, path, token):
    """GET ``path`` exactly as written: no client-side removal of dot segments or re-encoding."""
    connection = http.client.HTTPConnection("127.0.0.1", airflow.port, timeout=30)
    try:
        connection.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


@pytest.mark.parametrize("path", [
    "/mop/api/runs/{dag}/..", "/mop/api/runs/{dag}/%2E%2E", "/mop/api/runs/{dag}/.", "/mop/runs/{dag}/..",
    "/mop/api/runs/{dag}/..%2F..%2F{dag}", "/mop/api/runs/{dag}/%2Fetc%2Fpasswd", "/mop/api/runs/{dag}//etc/passwd",
    "/mop/api/runs/{dag}/{run}%2F..%2Fplan.json", "/mop/api/runs/..%2F{dag}/{run}", "/mop/api/runs/../{dag}/{run}",
    "/mop/api/runs/{dag}/{run}/files/..%2Frun.json", "/mop/api/runs/{dag}/{run}/files/../run.json",
    "/mop/api/runs/{dag}/{run}/files/../../run.json", "/mop/api/runs/{dag}/{run}/files/%2E%2E%2Fplan.json",
    "/mop/api/runs/{dag}/{run}/files/run.json", "/mop/api/runs/{dag}/{run}/files/%2Fetc%2Fpasswd",
    "/mop/api/runs/{dag}/{run}/files/..", "/mop/api/runs/{dag}/{run}/files/report%2Fsummary.json",
    "/mop/static/..%2F__init__.py", "/mop/static/../results_app.py",
])
def test_no_path_reaches_outside_the_runs_report_folder(airflow, finished, path):
    token = airflow.rest_api.token("admin")
    status, body = raw_get(airflow, path.format(dag=DAG_ID, run=quoted(finished.run_id)), token)
    assert status == 404, (path, body[:300])
    assert b'"configs"' not in body and b"import" not in body and b"root:" not in body
    # the same request for an allow-listed file succeeds, so the 404 is the path's doing
    ok, _ = raw_get(airflow, f"/mop/api/runs/{DAG_ID}/{quoted(finished.run_id)}/files/summary.json", token)
    assert ok == 200


def test_the_plugin_is_registered_with_its_views(airflow):
    listed = json.loads(cli(airflow, ["plugins", "--output", "json"]))
    plugin = next(p for p in listed if p["name"] == "mop_airflow")
    assert {(v["destination"], v["url_route"]) for v in plugin["external_views"]} == {
        ("dag_run", "mop-results"), ("nav", "mop-runs")}
    served = airflow.rest_api.call("GET", "/plugins")["plugins"]
    assert [a["url_prefix"] for p in served if p["name"] == "mop_airflow" for a in p["fastapi_apps"]] == ["/mop"]


def test_a_hyperband_run_shows_its_brackets_and_where_each_configuration_stopped(airflow, browser, tmp_path):
    """The page drawn from a Hyperband run's data (built by mop_airflow.results.page from hand-written hop
    records and a real rung decision, served in place of the API's answer): brackets and rungs with
    the decision, pruned outcomes, best per bracket, and a stop mark on each pruned curve."""
    from mop_airflow.planning.blocks import decide_next_block, first_block
    from mop_airflow.results.page import run_results
    from tests.test_results import MLP, hop, planned

    spec = tiny_spec("/data/digits.parquet", f"file://{tmp_path / 'store'}")
    spec["search"]["space"] = {"method": "random", "seed": 3, "params": {
        "model": [MLP], "learning_rate": {"distribution": "log_uniform", "low": 1e-4, "high": 3e-2},
        "batch_size": [32], "hparams": {"units": [32]}}}
    spec["search"]["adaptive"] = {"method": "hyperband", "R": 3, "eta": 3}
    layout, run, plan = planned(Store(spec["store"]["root"]), spec)
    first = plan.brackets["1"]
    first_block(layout, run, plan)  # both brackets side by side: block 1 trains all five to iteration 1
    for k, (accuracy, cid) in enumerate(zip((0.7, 0.5, 0.6, 0.4, 0.3), [*first, *plan.brackets["0"]])):
        for t in (0, 1):  # one hop at a time on each shard, as one slot allows
            hop(layout, cid, t, t, start=2 * (k + t), seconds=2, loss=1.0 - accuracy, acc=accuracy,
                val=(1.0 - accuracy, accuracy) if t == 1 else None)
    decide_next_block(layout, run, plan, 0)  # bracket 1's rung 0 ends there: its best goes on
    data = {**run_results(layout, run), "run_state": "running"}

    page = logged_in(browser, airflow)
    page.route("**/mop/api/runs/**", lambda route: route.fulfill(status=200, content_type="application/json",
                                                                  body=json.dumps(data)))
    page.goto(f"{airflow.base_url}/mop/runs/{layout.dag_id}/{quoted(layout.run_id)}")
    page.locator("#leaderboard tbody tr").first.wait_for(timeout=60_000)
    page.screenshot(path=str(tmp_path / "results_page_hyperband.png"), full_page=True)
    rows = {page.locator("#leaderboard tbody tr").nth(i).get_attribute("data-config-id"):
            page.locator("#leaderboard tbody tr").nth(i).locator("td").all_inner_texts() for i in range(5)}
    assert rows[first[0]][0] == "1" and rows[first[0]][-2] == "1"  # rank 1, bracket 1
    assert rows[first[0]][-1] == "training: 2 of 6 hops done"
    for loser in first[1:]:
        assert rows[loser][-1] == "pruned at rung 0: ranked below the top 1"
    assert page.locator("#leaderboard tbody tr[data-status='pruned']").count() == 2
    for chart in ("loss", "accuracy"):  # a stop mark per pruned configuration, on its curve
        marks = page.locator(f"svg#curves-{chart} path.stop-pruned")
        assert marks.count() == 2
        stopped = {marks.nth(i).locator("xpath=..").get_attribute("data-config-id") for i in range(2)}
        assert stopped == set(first[1:])
    best = page.locator("#best-per-bracket-table tbody tr").all_inner_texts()
    assert len(best) == 2 and any(first[0] in row and "0.7" in row for row in best)
    rung = page.locator("#brackets tbody tr[data-bracket='1'][data-rung='0'] td").all_inner_texts()
    assert rung[2:6] == ["3", "1", "2", "1"] and rung[6] == f"promoted {first[0]}; pruned 2"
    assert page.locator("#brackets tbody tr").count() == 3  # bracket 1: rungs 0 and 1; bracket 0: rung 0
    page.context.close()


def test_an_asha_run_shows_every_decision_between_blocks(airflow, browser, tmp_path):
    """The page drawn from an ASHA run's data (mop_airflow.results.page over hand-written hop records and
    the real decisions between its blocks): block 1 starts four configurations, block 2 promotes the
    best of them on its metric, ranked 1 of 4."""
    from mop_airflow.planning.blocks import decide_next_block, first_block
    from mop_airflow.results.page import run_results
    from tests.test_results import MLP, hop, planned

    spec = tiny_spec("/data/digits.parquet", f"file://{tmp_path / 'store'}")
    spec["search"]["space"] = {"method": "random", "seed": 3, "params": {
        "model": [MLP], "learning_rate": {"distribution": "log_uniform", "low": 1e-4, "high": 3e-2},
        "batch_size": [32], "hparams": {"units": [32]}}}
    spec["search"]["adaptive"] = {"method": "asha", "n": 4, "r": 1, "R": 3, "eta": 3}
    layout, run, plan = planned(Store(spec["store"]["root"]), spec)
    first_block(layout, run, plan)
    ids = [c["config_id"] for c in run.configs]
    for k, (accuracy, cid) in enumerate(zip((0.5, 0.8, 0.6, 0.7), ids)):
        for t in (0, 1):
            hop(layout, cid, t, t, start=2 * (k + t), seconds=2, loss=1.0 - accuracy, acc=accuracy,
                val=(1.0 - accuracy, accuracy) if t == 1 else None)
    decide_next_block(layout, run, plan, 0)
    data = {**run_results(layout, run), "run_state": "running"}

    page = logged_in(browser, airflow)
    page.route("**/mop/api/runs/**", lambda route: route.fulfill(status=200, content_type="application/json",
                                                                  body=json.dumps(data)))
    page.goto(f"{airflow.base_url}/mop/runs/{layout.dag_id}/{quoted(layout.run_id)}")
    page.locator("#decisions tbody tr").first.wait_for(timeout=60_000)
    page.screenshot(path=str(tmp_path / "results_page_asha.png"), full_page=True)
    assert "ASHA n=4 r=1 R=3 eta=3, decided between blocks" in page.locator("#plan-note").inner_text()
    starts = page.locator("#decisions tbody tr[data-block='0'][data-kind='start']")
    assert starts.count() == 4
    promoted = page.locator("#decisions tbody tr[data-kind='promote']")
    assert promoted.count() == 1 and promoted.get_attribute("data-config-id") == ids[1]
    assert promoted.locator("td").all_inner_texts()[3:] == ["1", "3", "0.8", "1 of 4"]  # to rung 1 (3 iterations)
    outcome = page.locator(f"#leaderboard tbody tr[data-config-id='{ids[1]}'] td").all_inner_texts()[-1]
    assert outcome == "training: 2 of 6 hops done"  # on its way to R=3 iterations of 2 hops
    assert page.locator("#best-per-bracket-table").count() == 0  # ASHA has no brackets

    # with a budget the plan note says so, and block 0 starts one configuration per slot
    spec["search"]["adaptive"] = {**spec["search"]["adaptive"], "budget": 6}
    budgeted, run, plan = planned(Store(f"file://{tmp_path / 'budget'}"), spec)
    first_block(budgeted, run, plan)
    data = {**run_results(budgeted, run), "run_state": "running"}
    page.unroute("**/mop/api/runs/**")
    page.route("**/mop/api/runs/**", lambda route: route.fulfill(status=200, content_type="application/json",
                                                                  body=json.dumps(data)))
    page.goto(f"{airflow.base_url}/mop/runs/{budgeted.dag_id}/{quoted(budgeted.run_id)}")
    page.locator("#decisions tbody tr").first.wait_for(timeout=60_000)
    assert "ASHA n=4 r=1 R=3 eta=3 budget=6 iterations, decided between blocks" in \
        page.locator("#plan-note").inner_text()
    assert page.locator("#decisions tbody tr[data-block='0'][data-kind='start']").count() == 2
    page.context.close()


def test_a_pbt_run_draws_its_family_tree_and_which_hyperparameters_mattered(airflow, browser, tmp_path):
    """The page drawn from a population-based training run's data (hand-written hop records and
    checkpoints, the real decision after its first block): member 0, the worst, went on as a copy of
    member 1, the best; the family tree shows each member's bars and the copy, and a report's
    importance table shows the learning rate first."""
    import io

    import numpy as np

    from mop_airflow.planning.blocks import decide_next_block, first_block
    from mop_airflow.records.checkpoint_file import FORMAT
    from mop_airflow.records.layout import with_proposed
    from mop_airflow.results.page import run_results
    from tests.test_results import MLP, hop, planned

    spec = tiny_spec("/data/digits.parquet", f"file://{tmp_path / 'store'}")
    lr = {"distribution": "log_uniform", "low": 1e-4, "high": 3e-2}
    spec["search"]["space"] = {"method": "random", "seed": 3, "params": {
        "model": [MLP], "learning_rate": lr, "batch_size": [32], "hparams": {"units": [32]}}}
    spec["search"]["adaptive"] = {"method": "pbt", "population": 4, "iterations": 3, "interval": 1,
                                  "mutations": {"learning_rate": lr}}
    layout, run, plan = planned(Store(spec["store"]["root"]), spec)
    first_block(layout, run, plan)
    ids = [c["config_id"] for c in run.configs]
    for k, (accuracy, cid) in enumerate(zip((0.5, 0.8, 0.6, 0.7), ids)):
        for t in (0, 1):
            record = hop(layout, cid, t, t, start=2 * (k + t), seconds=2, loss=1.0 - accuracy, acc=accuracy,
                         val=(1.0 - accuracy, accuracy) if t == 1 else None)
        buffer = io.BytesIO()  # the state of its last hop, in the checkpoint file's format
        np.savez(buffer, **{"model/00000": np.full(3, float(k)), "meta": np.frombuffer(json.dumps(
            {"format": FORMAT, "meta": {"config_id": cid, "t": 1}}).encode(), dtype=np.uint8)})
        layout.store.write_bytes(layout.checkpoint_uri(cid, 1), buffer.getvalue())
        record.__class__(**{**record.to_dict(), "checkpoint": layout.checkpoint_uri(cid, 1)}).write(
            layout.store, layout.hop_record_uri(cid, 1))
    decision = decide_next_block(layout, run, plan, 0)
    (copy,) = decision.copies
    assert (copy["replaced"], copy["parent"], copy["member"]) == (ids[0], ids[1], 0)
    data = {**run_results(layout, run), "run_state": "running"}
    data["leaderboard"]["importance"] = {"metric": "val_accuracy", "evaluator": "fANOVA", "trials": 4, "importances": [
        {"field": "learning_rate", "importance": 0.9}, {"field": "batch_size", "importance": 0.1}]}

    page = logged_in(browser, airflow)
    page.route("**/mop/api/runs/**", lambda route: route.fulfill(status=200, content_type="application/json",
                                                                  body=json.dumps(data)))
    page.goto(f"{airflow.base_url}/mop/runs/{layout.dag_id}/{quoted(layout.run_id)}")
    page.locator("#lineage svg").wait_for(timeout=60_000)
    page.screenshot(path=str(tmp_path / "results_page_pbt.png"), full_page=True)
    bars = page.locator("#lineage rect.segment")
    members = sorted((bars.nth(k).get_attribute("data-member"), bars.nth(k).get_attribute("data-config-id"))
                     for k in range(bars.count()))
    child = copy["config_id"]
    assert members == sorted([("0", ids[0]), ("0", child), ("1", ids[1]), ("2", ids[2]), ("3", ids[3])])
    edge = page.locator("#lineage line.copy")
    assert edge.count() == 1 and (edge.get_attribute("data-config-id"), edge.get_attribute("data-parent")) == \
        (child, ids[1])
    cells = page.locator(f"#copies tbody tr[data-config-id='{child}'] td").all_inner_texts()
    assert cells[:4] == ["1", "0", f"{ids[0]} (0.5)", f"{ids[1]} (0.8)"] and cells[5].startswith("learning_rate ")
    assert page.locator("#decisions tbody tr[data-kind='exploit']").get_attribute("data-config-id") == child
    assert "population-based training, population=4 iterations=3 interval=1" in page.locator("#plan-note").inner_text()
    outcomes = {cid: page.locator(f"#leaderboard tbody tr[data-config-id='{cid}'] td").all_inner_texts()[-1]
                for cid in (ids[0], child)}
    assert outcomes[ids[0]].startswith("replaced after iteration 1: ranked 4 of 4, so member 0 went on as " + child)
    assert outcomes[child] == "training: member 0, iteration 2 of 3"
    rows = page.locator("#importance tbody tr")
    assert rows.count() == 2 and rows.first.get_attribute("data-field") == "learning_rate"
    assert "fANOVA importance" in page.locator("#importance-note").inner_text()
    assert child in {c["config_id"] for c in with_proposed(layout, run).configs}
    page.context.close()


@pytest.fixture(scope="module")
def group_run(airflow, finished):
    """A run of the DAG of two groups: model_selection's selection is the finished run written again as
    the group writes it (reported), challenger's the same without its report (still training)."""
    from tests.test_group_runs import as_group_run

    run_id = "manual__groups"
    root = airflow.root / "store"
    done = as_group_run(finished, root, f"{GROUPS_DAG}.model_selection", run_id)
    going = as_group_run(finished, root, f"{GROUPS_DAG}.challenger", run_id)
    shutil.rmtree(going.store.local_path(going.report_uri("")))
    api = airflow.rest_api
    api.call("PATCH", f"/dags/{GROUPS_DAG}", json={"is_paused": False})
    api.call("POST", f"/dags/{GROUPS_DAG}/dagRuns", json={"logical_date": None, "dag_run_id": run_id})
    assert api.wait_for_run(GROUPS_DAG, run_id, timeout=180) == "success"
    return done, going


def test_a_run_of_task_groups_lists_and_serves_each_groups_selection(airflow, finished, group_run):
    done, going = group_run
    api, base = airflow.rest_api, f"/mop/api/runs/{GROUPS_DAG}/{done.run_id}"
    runs = {(r["dag_id"], r["run_id"]): r for r in api.get("/mop/api/runs").json()["runs"]}
    assert runs[(GROUPS_DAG, done.run_id)]["groups"] == ["challenger", "model_selection"]
    assert runs[(DAG_ID, finished.run_id)]["groups"] == []

    board = done.store.read_json(done.report_uri("leaderboard.json"))["leaderboard"]
    reported = api.get(f"{base}?group=model_selection").json()
    assert (reported["group"], reported["groups"], reported["selection_id"], reported["stage"]) == (
        "model_selection", ["challenger", "model_selection"], f"{GROUPS_DAG}.model_selection", "reported")
    assert reported["dag_id"] == GROUPS_DAG and reported["run_state"] == "success"
    assert [r["config_id"] for r in reported["leaderboard"]["leaderboard"]] == [r["config_id"] for r in board]
    assert reported["leaderboard"]["final"] is True and reported["progress"]["hops_done"] == 12
    training = api.get(base).json()  # no group asked: the run's first group
    assert (training["group"], training["stage"], training["leaderboard"]["final"]) == ("challenger", "training", False)
    assert training["progress"]["hops_done"] == 12 and len(training["leaderboard"]["leaderboard"]) == 3
    missing = api.get(f"{base}?group=nope")
    assert missing.status_code == 404 and "has no MopTaskGroup 'nope': its groups are challenger, model_selection" \
        in missing.json()["detail"]
    assert "it is a whole MOP DAG's run" in api.get(
        f"/mop/api/runs/{DAG_ID}/{quoted(finished.run_id)}?group=model_selection").json()["detail"]

    model = api.get(f"{base}/files/best_model.keras?group=model_selection")
    assert model.status_code == 200 and model.content == done.store.read_bytes(done.report_uri("best_model.keras"))
    assert api.get(f"{base}/files/best_model.keras").status_code == 404  # challenger has no report yet
    # the same rights as before: the DAG's read permission, whatever the group
    for route in (f"{base}?group=model_selection", f"{base}/files/best_model.keras?group=model_selection"):
        assert api.get(route, user="reader").status_code == 403, route
        assert api.get(route, user=None).status_code == 401, route
    assert (GROUPS_DAG, done.run_id) not in {(r["dag_id"], r["run_id"])
                                             for r in api.get("/mop/api/runs", user="reader").json()["runs"]}


def test_the_page_of_a_run_of_groups_switches_between_them(airflow, browser, group_run, tmp_path):
    done, going = group_run
    page = logged_in(browser, airflow)
    page.goto(f"{airflow.base_url}/mop/")
    row = page.locator(f"#runs tbody tr[data-dag-id='{GROUPS_DAG}']")
    row.wait_for(timeout=60_000)
    assert row.get_attribute("data-groups") == "challenger model_selection"
    assert row.locator("td.groups a").all_inner_texts() == ["challenger", "model_selection"]
    row.locator("td.groups a[data-group='model_selection']").click()

    page.wait_for_function("() => document.body.dataset.stage === 'reported'", timeout=60_000)
    assert page.locator("#title").inner_text() == f"{GROUPS_DAG} \u00b7 {done.run_id} \u00b7 group model_selection"
    links = page.locator("#selections a")
    assert links.all_inner_texts() == ["challenger", "model_selection"]
    assert page.locator("#selections a.current").inner_text() == "model_selection"
    assert page.locator("#leaderboard-note").inner_text().startswith("Final, from the run's report")
    assert page.locator("#leaderboard tbody tr").count() == 3
    href = page.locator("a[data-file='metrics.json']").get_attribute("href")
    assert href.endswith(f"/files/metrics.json?group=model_selection")
    page.screenshot(path=str(tmp_path / "results_page_groups.png"), full_page=True)

    page.locator("#selections a[data-group='challenger']").click()
    page.wait_for_function("() => document.body.dataset.stage === 'training'", timeout=60_000)
    assert page.locator("#selections a.current").inner_text() == "challenger"
    assert page.locator("#leaderboard-note").inner_text().startswith("Provisional")
    assert page.locator("#downloads a").count() == 0
    page.context.close()
