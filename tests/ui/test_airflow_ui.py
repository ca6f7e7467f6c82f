"""The local Airflow in headless Chromium: log in, open stream_user_clicks, trigger it
from the form, wait for success, keep screenshots, and check the Delta state; then a
maintenance rewind whose plan is reviewed in the approval: rejected, then approved."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from jobs.local_server import find_free_port
from jobs.settings import REPO_ROOT
from tests.conftest import pipeline_file, produce
from tests.expected import clicks_per_window, state_as_counter

pytestmark = pytest.mark.integration
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = REPO_ROOT / "test-artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def local_airflow(env: dict[str, str], action: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "include.local_airflow", action],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.fixture
def airflow(broker, kafka_config, new_topic, tmp_path: Path) -> Iterator[dict[str, Any]]:  # type: ignore[no-untyped-def]
    topic = new_topic(2)
    now = int(time.time())
    values = [
        json.dumps({"user_id": f"u{i % 13}", "timestamp": now - 400 + i % 300}).encode()
        for i in range(1200)
    ] + [b"{oops"]
    produce(kafka_config, topic, values)
    pipelines = tmp_path / "pipelines"
    pipeline_file(pipelines, "user_clicks", topic)
    port = find_free_port(12000, 13000, run=3)
    driver_port = find_free_port(13000, 14000)
    env = {
        **os.environ,
        "PLATFORM_AIRFLOW_HOME": str(tmp_path / "airflow"),
        "PLATFORM_AIRFLOW_PORT": str(port),
        "PLATFORM_DRIVER_PORT": str(driver_port),
        "PLATFORM_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
        "PLATFORM_WAREHOUSE": str(tmp_path / "warehouse"),
        "PLATFORM_PIPELINES_DIR": str(pipelines),
        "PLATFORM_DRIVER_TRAIN_EVENTS": "0",  # its training is tested with the driver's
    }
    for key in ("AIRFLOW_HOME", "AIRFLOW__CORE__DAGS_FOLDER", "AIRFLOW__CORE__UNIT_TEST_MODE"):
        env.pop(key, None)  # the test session's own Airflow settings
    started = local_airflow(env, "start")
    assert started.returncode == 0, started.stderr + started.stdout
    print(started.stdout)
    password = json.loads(
        (tmp_path / "airflow" / "simple_auth_manager_passwords.json.generated").read_text()
    )["admin"]
    try:
        yield {
            "port": port,
            "driver_port": driver_port,
            "password": password,
            "values": values,
            "warehouse": tmp_path / "warehouse",
            "home": tmp_path / "airflow",
        }
    finally:
        stopped = local_airflow(env, "stop")
        assert stopped.returncode == 0


def api(port: int, password: str, path: str, method: str = "GET", body: Any = None) -> Any:
    """One call of Airflow's REST API. A read or a pause (idempotent) that the busy
    machine leaves unanswered for 30 s is made again; a trigger (POST) is not."""
    for attempt in range(3):
        try:
            return _api_once(port, password, path, method, body)
        except TimeoutError:
            if attempt == 2 or method == "POST":
                raise
    raise AssertionError("unreachable")


def _api_once(port: int, password: str, path: str, method: str, body: Any) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/auth/token",
        data=json.dumps({"username": "admin", "password": password}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        token = json.loads(response.read())["access_token"]
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def wait_until(what: str, check: Any, seconds: float = 300) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def task_states(airflow: dict[str, Any], dag_id: str, run_id: str) -> dict[str, str]:
    path = f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id)}/taskInstances"
    found = api(airflow["port"], airflow["password"], path)["task_instances"]
    return {t["task_id"]: str(t["state"]) for t in found}


def ledger_rows(warehouse: Path, entry_type: str) -> list[dict[str, Any]]:
    table = DeltaTable(str(warehouse / "user_clicks" / "_ledger")).to_pyarrow_table().to_pylist()
    rows = sorted(
        (r for r in table if r["entry_type"] == entry_type), key=lambda r: r["commit_time"]
    )
    return [{**r, "details": json.loads(r["details"])} for r in rows]


def stream_runs_settled(airflow: dict[str, Any]) -> bool:
    runs = api(airflow["port"], airflow["password"], "/api/v2/dags/stream_user_clicks/dagRuns")
    return all(r["state"] in ("success", "failed") for r in runs["dag_runs"])


def run_report(airflow: dict[str, Any], dag_id: str, run_id: str | None = None) -> str:
    """Every task's state and the tail of each of its log files, for ``run_id`` or,
    without one, for every run of ``dag_id``; the warm driver's log and
    Airflow's errors."""
    try:
        runs = api(airflow["port"], airflow["password"], f"/api/v2/dags/{dag_id}/dagRuns")
        run_ids = [str(r["dag_run_id"]) for r in runs["dag_runs"]]
        lines = [f"{dag_id} runs: {[(r['dag_run_id'], r['state']) for r in runs['dag_runs']]}"]
    except OSError as error:
        run_ids, lines = [], [f"{dag_id}: runs unavailable ({error})"]
    for each in [run_id] if run_id else run_ids:
        try:
            lines.append(f"{each}: {task_states(airflow, dag_id, each)}")
        except OSError as error:
            lines.append(f"{each}: task states unavailable ({error})")
    logs = airflow["home"] / "logs"
    for log in sorted(logs.glob(f"dag_id={dag_id}/**/*.log")):
        if run_id is None or run_id in str(log) or urllib.parse.quote(run_id) in str(log):
            lines += [f"--- {log.relative_to(logs)}", log.read_text()[-3000:]]
    driver = airflow["home"] / "warm-driver.log"
    if driver.exists():
        lines += ["--- warm-driver.log (end)", driver.read_text(errors="replace")[-4000:]]
    standalone = airflow["home"] / "standalone.log"
    if standalone.exists():
        noted = [
            line
            for line in standalone.read_text(errors="replace").splitlines()
            if (run_id and run_id in line) or "ERROR" in line or "Traceback" in line
        ]
        lines += ["--- standalone.log (errors)", *(n[:400] for n in noted[-120:])]
    return "\n".join(lines)


def approval_pause_noted(airflow: dict[str, Any], run_id: str) -> bool:
    log = airflow["home"] / "standalone.log"
    finished = (
        f"TaskInstance Finished: dag_id=maintenance_rewind, task_id=approval, run_id={run_id},"
    )
    return log.exists() and finished in log.read_text(errors="replace")


def review_a_rewind(page: Any, airflow: dict[str, Any], answer: str, shot: str) -> str:
    """Trigger maintenance_rewind, open its approval in the browser, answer it."""
    base = f"http://127.0.0.1:{airflow['port']}"
    conf = {
        "pipeline": "user_clicks",
        "target": "to-earliest",
        "target_value": "",
        "topics": "",
        "mode": "reprocess",
        "reason": f"browser test: {answer}",
    }
    run = api(
        airflow["port"],
        airflow["password"],
        "/api/v2/dags/maintenance_rewind/dagRuns",
        "POST",
        {"logical_date": None, "conf": conf},
    )
    run_id = run["dag_run_id"]
    wait_until(
        "the approval to wait for a person",
        lambda: (
            task_states(airflow, "maintenance_rewind", run_id).get("approval")
            in ("awaiting_input", "deferred")
        ),
    )
    # Airflow 3.3's scheduler fails a resumed task when it drains the executor's
    # "success" of the process that paused it only after the answer requeued it
    # ("finished with state success, but the task instance's state attribute is
    # queued": apache/airflow#72716, reproduced here). A person takes longer than
    # that drain; a browser test must wait for it, as docs/operations.md says to.
    wait_until(
        "the scheduler to note the approval's pause",
        lambda: approval_pause_noted(airflow, run_id),
    )
    page.goto(
        f"{base}/dags/maintenance_rewind/runs/{urllib.parse.quote(run_id)}/tasks/approval"
        "/required_actions"
    )
    page.get_by_text("Apply this rewind of user_clicks?").first.wait_for(timeout=60000)
    page.get_by_text("records to replay").first.wait_for(timeout=30000)
    page.screenshot(path=str(ARTIFACTS / shot), full_page=True)
    page.get_by_role("button", name=answer).first.click()

    def finished() -> str | None:
        runs = api(airflow["port"], airflow["password"], "/api/v2/dags/maintenance_rewind/dagRuns")
        state = next((str(r["state"]) for r in runs["dag_runs"] if r["dag_run_id"] == run_id), None)
        return state if state in ("success", "failed") else None

    assert wait_until("the rewind run to finish", finished) == "success", run_report(
        airflow, "maintenance_rewind", run_id
    )
    return str(run_id)


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed")
def test_trigger_stream_user_clicks_from_the_ui(airflow: dict[str, Any]) -> None:
    from playwright.sync_api import sync_playwright

    base = f"http://127.0.0.1:{airflow['port']}"
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(f"{base}/")
        page.get_by_label("Username").fill("admin")
        page.get_by_label("Password").fill(airflow["password"])
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(lambda url: "/auth/login" not in url, timeout=30000)
        page.goto(f"{base}/dags")
        page.get_by_text("stream_user_clicks").first.wait_for(timeout=60000)
        page.screenshot(path=str(ARTIFACTS / "airflow-dag-list.png"))

        page.goto(f"{base}/dags/stream_user_clicks")
        page.get_by_role("button", name="Trigger").first.click()
        dialog = page.get_by_role("dialog")
        dialog.get_by_text("Unpause stream_user_clicks on trigger").wait_for(timeout=30000)
        page.screenshot(path=str(ARTIFACTS / "airflow-trigger-form.png"))
        dialog.get_by_role("button", name="Trigger").click()
        try:  # the form closes once Airflow has taken the run
            dialog.wait_for(state="hidden", timeout=60000)
        except Exception:  # Playwright's TimeoutError: a person would click again
            page.screenshot(path=str(ARTIFACTS / "airflow-trigger-still-open.png"))
            dialog.get_by_role("button", name="Trigger").click()

        def manual_runs() -> list[dict[str, Any]]:
            runs = api(
                airflow["port"], airflow["password"], "/api/v2/dags/stream_user_clicks/dagRuns"
            )
            # Unpausing may also start a scheduled run: follow the one we triggered.
            return [r for r in runs["dag_runs"] if r["run_type"] == "manual"]

        try:
            triggered = wait_until("the form to create the run", manual_runs, seconds=120)[0]
        except AssertionError:
            page.screenshot(path=str(ARTIFACTS / "airflow-trigger-no-run.png"))
            raise AssertionError(
                "the trigger form created no run in 120 s (screenshot: "
                "airflow-trigger-no-run.png)\n" + run_report(airflow, "stream_user_clicks")
            ) from None
        run_id = str(triggered["dag_run_id"])

        def finished() -> str | None:
            [run] = [r for r in manual_runs() if r["dag_run_id"] == run_id]
            return str(run["state"]) if run["state"] in ("success", "failed") else None

        # The triggered run waits for the scheduled one (one run at a time), and
        # that one may take its retries (30 s, then 60 s apart) on a busy machine.
        try:
            state = wait_until("the triggered run to finish", finished, seconds=600)
        except AssertionError as timed_out:
            raise AssertionError(
                f"{timed_out}\n{run_report(airflow, 'stream_user_clicks')}"
            ) from None
        page.reload()
        page.wait_for_timeout(2000)
        page.screenshot(path=str(ARTIFACTS / "airflow-run-finished.png"))
        assert state == "success", run_report(airflow, "stream_user_clicks")
        # The run went to the warm driver `make airflow` started (no spark-submit).
        report = run_report(airflow, "stream_user_clicks", run_id)
        assert f"on the warm driver http://127.0.0.1:{airflow['driver_port']}" in report, report
        assert "with spark-submit instead" not in report
        expected, _dead, _late = clicks_per_window([airflow["values"]])
        table = DeltaTable(str(airflow["warehouse"] / "user_clicks" / "state")).to_pyarrow_table()
        assert state_as_counter(table.to_pylist(), "clicks") == expected

        # Maintenance with a person in the loop: the stream paused (a scheduled run
        # would move the application away from the plan), the rewind's plan shown
        # in the approval, rejected once (nothing applied, recorded), then approved.
        for dag_id in ("stream_user_clicks", "maintenance_rewind"):
            paused = dag_id == "stream_user_clicks"
            api(
                airflow["port"],
                airflow["password"],
                f"/api/v2/dags/{dag_id}",
                "PATCH",
                {"is_paused": paused},
            )
        # Unpausing on trigger also started a scheduled run; pausing stops new ones,
        # not one already queued or running, and a stream run holds the application.
        wait_until("the stream's runs to finish", lambda: stream_runs_settled(airflow))
        rejected = review_a_rewind(page, airflow, "Reject", "airflow-approval-rejected.png")
        assert task_states(airflow, "maintenance_rewind", rejected)["apply"] == "skipped"
        [decision] = [
            r for r in ledger_rows(airflow["warehouse"], "rewind") if r["details"].get("decision")
        ]
        assert decision["details"]["decision"] == "rejected"
        assert not [
            r
            for r in ledger_rows(airflow["warehouse"], "rewind")
            if r["details"].get("phase") == "done"
        ]

        review_a_rewind(page, airflow, "Approve", "airflow-approval.png")
        browser.close()
    done = [
        r
        for r in ledger_rows(airflow["warehouse"], "rewind")
        if r["details"].get("phase") == "done"
    ]
    assert len(done) == 1
    planned = [
        r["details"]["plan"]["plan_id"]
        for r in ledger_rows(airflow["warehouse"], "rewind")
        if r["details"].get("dry_run") and "plan" in r["details"]
    ]
    assert done[0]["details"]["plan"]["plan_id"] == planned[-1]  # exactly the approved plan
    state_rows = DeltaTable(str(airflow["warehouse"] / "user_clicks" / "state")).to_pyarrow_table()
    assert state_rows.num_rows == 0  # rewound to the earliest offsets: emptied until the next run
