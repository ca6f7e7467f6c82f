"""``python -m jobs``: run and inspect pipelines, and manage the embedded broker.

The same entry point runs under ``spark-submit jobs/__main__.py ...`` on a worker.
Expected failures (bad arguments, bad pipeline files, broker problems, fencing)
print one ``error:`` line and exit 2; anything else exits 1 with its traceback
followed by one ``error:`` line, so the last line always says what failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from jobs import faults
from jobs.errors import (
    EXIT_CRASH,
    ConfigError,
    LockedError,
    PlatformError,
    failure,
    refused,
)
from jobs.operations.shadow import CATCH_UP_RECORDS, MAX_SWITCH_WITHIN
from jobs.pipeline.model import Pipeline
from jobs.pipeline.parser import load_pipeline
from jobs.settings import Settings, bootstrap_servers, load_settings, warehouse_location

METRICS_EXPORTER_PORT = 9464  # the exporter's default port


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"{self.prog}: {message}")


# A string: a Path would make s3://bucket/prefix a local folder named "s3:".
WAREHOUSE_HELP = "the Delta tables' folder or s3://bucket/prefix"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m jobs", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = commands.add_parser("run", help="run a pipeline's streaming aggregation")
    _pipeline_args(run)
    run.add_argument("--trigger", choices=["available-now", "continuous"])
    run.add_argument("--quiet", action="store_true", help="do not print the state and ledger")

    status = commands.add_parser("status", help="where an application stands, and its problems")
    _pipeline_args(status)
    status.add_argument("--json", action="store_true", help="machine-readable output")

    rewind = commands.add_parser(
        "rewind", help="move an application's input to other offsets, exactly (audited)"
    )
    _pipeline_args(rewind)
    target = rewind.add_mutually_exclusive_group(required=True)
    target.add_argument("--plan", metavar="ID", help="apply exactly a plan a --dry-run saved")
    target.add_argument("--to-earliest", action="store_true", help="the log start")
    target.add_argument("--to-latest", action="store_true", help="the log end")
    target.add_argument("--to-offset", metavar="SPEC", help="N, or JSON topic->partition->offset")
    target.add_argument("--to-datetime", metavar="ISO", help="first record at/after a time")
    target.add_argument("--by-duration", metavar="PnDTnHnMnS", help="that long before now")
    target.add_argument("--shift-by", metavar="N", help="N records from the committed offsets")
    rewind.add_argument("--topics", help="comma list (default: all the pipeline's topics)")
    rewind.add_argument(
        "--mode",
        choices=["reprocess", "skip"],
        default="reprocess",
        help="reprocess: state goes back and input replays; skip: state kept, input jumps",
    )
    _operation_args(rewind, saves_plans=True)
    _digest_arg(rewind)

    rebuild = commands.add_parser(
        "rebuild", help="restore Spark's state from Delta (or recompute it) in a new epoch"
    )
    _pipeline_args(rebuild)
    rebuild.add_argument(
        "--from-source", action="store_true", help="recompute from the earliest offsets"
    )
    rebuild.add_argument("--plan", metavar="ID", help="apply exactly a plan a --dry-run saved")
    _operation_args(rebuild, saves_plans=True)
    _digest_arg(rebuild)

    backfill = commands.add_parser(
        "backfill", help="recompute with the current pipeline version and publish atomically"
    )
    _pipeline_args(backfill)
    start = backfill.add_mutually_exclusive_group(required=True)
    start.add_argument("--plan", metavar="ID", help="apply exactly a plan a --preview saved")
    start.add_argument("--from-earliest", action="store_true", help="the application's start")
    start.add_argument("--from-datetime", metavar="ISO", help="first record at/after a time")
    start.add_argument("--from-offset", metavar="SPEC", help="N, or JSON topic->partition->offset")
    backfill.add_argument("--reason", required=True, help="why (recorded in the ledger)")
    backfill.add_argument(
        "--preview", action="store_true", help="write and print the corrections, publish nothing"
    )
    backfill.add_argument("--save-plan", metavar="ID", help="the id a preview saves its plan as")
    _digest_arg(backfill)
    backfill.add_argument(
        "--source",
        choices=["kafka", "archive"],
        default="kafka",
        help="read the records from Kafka or from the raw archive (beyond retention)",
    )
    backfill.add_argument(
        "--dimensions",
        choices=["recorded", "newest"],
        default="recorded",
        help="join each enrichment table at the version each batch recorded, or at its "
        "newest (after a fix of the table)",
    )
    backfill.add_argument(
        "--form",
        choices=["blue-green", "stop-the-world"],
        default="blue-green",
        help="with a stream running: recompute beside it and fence it only for the catch-up "
        "on its last batches and the publish (blue-green), or fence it for the whole "
        "recomputation",
    )
    backfill.add_argument(
        "--switch-within",
        metavar="RECORDS",
        type=int,
        default=CATCH_UP_RECORDS,
        help="blue-green: fence the stream once at most this many records it judged are "
        f"left to catch up on (default {CATCH_UP_RECORDS:,})",
    )

    maintain = commands.add_parser(
        "maintain",
        help="compact, vacuum and checkpoint the tables, keeping every rewind target (audited)",
    )
    _pipeline_args(maintain)
    _operation_args(maintain)

    verify = commands.add_parser(
        "verify", help="recompute the state in batch and compare it with the published one"
    )
    _pipeline_args(verify)
    verify.add_argument("--sample", type=float, help="compare only this fraction of the keys")
    verify.add_argument("--source", choices=["kafka", "archive"], default="kafka")

    summarize = commands.add_parser(
        "summarize",
        help="bring <app>_daily, the daily summary of a windowed state, up to date (Spark)",
    )
    _pipeline_args(summarize)

    dimension = commands.add_parser(
        "dimension",
        help="load a dimension's file into its Delta table (a new version when rows changed)",
    )
    dimension.add_argument(
        "--dimension", required=True, help="a name in include/dimensions or a path"
    )
    dimension.add_argument("--warehouse", help=WAREHOUSE_HELP)

    publish = commands.add_parser(
        "publish",
        help="bring the output topic up to date, or republish the whole state (audited)",
    )
    _pipeline_args(publish)
    publish.add_argument(
        "--snapshot",
        action="store_true",
        help="publish the whole state, marked snapshot (the repair for an untrusted topic)",
    )
    _operation_args(publish)

    serve = commands.add_parser(
        "serve", help="a warm driver: run the available-now runs sent to it (PLATFORM_DRIVER_URL)"
    )
    serve.add_argument("--port", type=int, help="default: $PLATFORM_DRIVER_PORT or 18090")
    serve.add_argument("--bootstrap-servers", help="HOST:PORT[,HOST:PORT]")
    serve.add_argument("--warehouse", help=WAREHOUSE_HELP)
    serve.add_argument(
        "--train-events",
        type=int,
        help="before serving, train the JIT on this many synthetic events (a local master; "
        "default: $PLATFORM_DRIVER_TRAIN_EVENTS or 0, none)",
    )

    metrics = commands.add_parser(
        "metrics", help="every application's metrics from its ledger and the broker"
    )
    metrics.add_argument(
        "--serve", action="store_true", help="serve /metrics (default: print them once)"
    )
    metrics.add_argument("--port", type=int, help="default: $PLATFORM_METRICS_PORT or 9464")
    metrics.add_argument("--bootstrap-servers", help="HOST:PORT[,HOST:PORT]")
    metrics.add_argument("--warehouse", help=WAREHOUSE_HELP)

    commands.add_parser(
        "jars",
        help="the jars every Spark session of the platform adds, one per line "
        '(spark-submit --jars "$(python -m jobs jars | paste -sd,)")',
    )

    broker = commands.add_parser("broker", help="the embedded Apache Kafka broker")
    broker.add_argument("action", choices=["start", "stop", "status"])
    broker.add_argument("--port", type=int, help="default: $PLATFORM_BROKER_PORT or 19092")
    broker.add_argument("--data-dir", type=Path, help="default: $PLATFORM_BROKER_DATA_DIR")
    broker.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="start: 1 (one node) or 3 (a replicated cluster on free loopback ports: "
        "replication factor 3, min.insync.replicas 2)",
    )
    storage = commands.add_parser(
        "storage", help="the embedded S3 server (SeaweedFS), and checks of any S3 store"
    )
    storage.add_argument("action", choices=["start", "stop", "status", "check"])
    storage.add_argument("--port", type=int, help="default: $PLATFORM_STORAGE_PORT or 19333")
    storage.add_argument("--data-dir", type=Path, help="default: $PLATFORM_STORAGE_DATA_DIR")
    storage.add_argument("--bucket", default="warehouse", help="start: the bucket it makes")
    storage.add_argument(
        "--warehouse",
        help="check: the s3://bucket/prefix to qualify, with the AWS_* variables of its store",
    )
    storage.add_argument("--rounds", type=int, default=10, help="check: races per guarantee")
    storage.add_argument("--writers", type=int, default=8, help="check: writers in each race")
    return parser


def _pipeline_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pipeline", required=True, help="a name in include/pipelines or a path")
    parser.add_argument("--bootstrap-servers", help="HOST:PORT[,HOST:PORT]")
    parser.add_argument("--warehouse", help=WAREHOUSE_HELP)


def _operation_args(parser: argparse.ArgumentParser, saves_plans: bool = False) -> None:
    parser.add_argument("--reason", required=True, help="why (recorded in the ledger)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    if saves_plans:
        parser.add_argument("--save-plan", metavar="ID", help="the id a dry run saves its plan as")


def _digest_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--plan-digest",
        metavar="SHA256",
        help="with --plan: apply it only if it is exactly the plan reviewed (the digest its "
        "dry run printed)",
    )


def _port(given: int | None, default: int) -> int:
    """``--port``, or the command's default when it is not given (0 is not "not given")."""
    port = default if given is None else given
    if not 1 <= port <= 65535:
        raise ConfigError(f"--port must be 1-65535, got {port}")
    return port


def _settings(args: argparse.Namespace) -> Settings:
    settings = load_settings()
    servers = getattr(args, "bootstrap_servers", None)
    if servers is not None:
        settings = replace(
            settings, bootstrap_servers=bootstrap_servers(servers, "--bootstrap-servers")
        )
    warehouse = getattr(args, "warehouse", None)
    if warehouse is not None:
        settings = replace(settings, warehouse=warehouse_location(str(warehouse), "--warehouse"))
    return settings


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to ``sys.stderr`` as it is when a record comes: a process that runs
    several commands (``hosted_by``) may redirect it between them."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def configure_logging() -> None:
    """The platform's module loggers (one line per batch, operations' steps) go to
    stderr; Spark and Kafka clients keep their own quieter settings."""
    root = logging.getLogger("jobs")
    if not any(isinstance(h, _StderrHandler) for h in root.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(logging.INFO)
    root.propagate = False


def main(argv: list[str] | None = None) -> int:
    configure_logging()
    try:
        args = build_parser().parse_args(argv)
        if args.command == "broker":
            return _broker(args)
        if args.command == "storage":
            return _storage(args)
        if args.command == "jars":
            from jobs.jars import spark_jars

            print("\n".join(str(jar) for jar in spark_jars()))
            return 0
        if getattr(args, "save_plan", None) is not None:
            from jobs.operations.saved_plans import check_id

            check_id(args.save_plan)  # before the plan is made, not when it is saved
        if getattr(args, "plan_digest", None) is not None:
            from jobs.operations.saved_plans import check_digest

            if args.plan is None:
                raise ConfigError("--plan-digest checks the plan --plan applies: give both")
            check_digest(args.plan_digest)
        settings = _settings(args)
        if args.command == "serve":
            from jobs.driver_training import check
            from jobs.warm_driver import serve

            port = _port(args.port, settings.driver_port)
            events = (
                settings.driver_train_events if args.train_events is None else args.train_events
            )
            return serve(settings, port, check(events, settings.spark_master))
        if args.command == "metrics":
            from jobs import metrics_exporter

            if not args.serve:
                if args.port is not None:
                    raise ConfigError("--port is where --serve listens: give both, or neither")
                print(metrics_exporter.exposition(settings), end="")
                return 0
            port = _port(args.port, settings.metrics_port or METRICS_EXPORTER_PORT)
            return metrics_exporter.serve_forever(settings, port, settings.metrics_address)
        if args.command == "dimension":
            return _dimension(args, settings)
        pipeline = load_pipeline(args.pipeline, settings.pipelines_dir)
        if args.command == "status":
            from jobs.status import application_status, format_status

            status = application_status(pipeline, settings)
            text = json.dumps(status.to_dict(), indent=2, default=str)
            print(text if args.json else format_status(status))
            return 0
        if args.command in ("rewind", "rebuild", "backfill", "maintain", "publish", "verify"):
            return _counted_operation(args, settings, pipeline)
        if args.command == "summarize":
            from jobs.daily_summary import check_summarizable, summarize
            from jobs.streaming.spark import command_session

            check_summarizable(pipeline, settings)
            with command_session(settings, "summarize") as spark:
                summarize(spark, pipeline, settings)
            return 0
        return _run(args, settings, pipeline)
    except Exception as exc:
        code, message = failure(exc)
        if code == EXIT_CRASH and not isinstance(exc, PlatformError):
            traceback.print_exc()
        print(f"error: {message}", file=sys.stderr)
        return code


def _dimension(args: argparse.Namespace, settings: Settings) -> int:
    from jobs.dimension_load import load_dimension, refresh
    from jobs.streaming.spark import command_session

    dimension = load_dimension(args.dimension, settings.dimensions_dir)
    with command_session(settings, f"dimension-{dimension.name}") as spark:
        done = refresh(spark, dimension, settings.warehouse)
    table = dimension.table(settings.warehouse)
    state = "committed" if done.changed else "unchanged at"
    print(f"{dimension.name}: {done.rows} rows, {state} version {done.version} of {table}")
    return 0


def _counted_operation(args: argparse.Namespace, settings: Settings, pipeline: Pipeline) -> int:
    """An operation, counted by result in the metrics and pushed when configured."""
    from jobs.metrics import METRICS, push

    result = "failed"
    try:
        if args.command == "backfill":
            code = _backfill(args, settings, pipeline)
        elif args.command == "maintain":
            from jobs.operations.maintain import run_maintain
            from jobs.operations.runner import check_reason

            run_maintain(pipeline, settings, check_reason(args.reason), args.dry_run)
            code = 0
        elif args.command == "verify":
            code = _verify(args, settings, pipeline)
        elif args.command == "publish":
            from jobs.operations.publish import run_publish
            from jobs.operations.runner import check_reason

            run_publish(pipeline, settings, check_reason(args.reason), args.snapshot, args.dry_run)
            code = 0
        else:
            code = _operation(args, settings, pipeline)
        dry = getattr(args, "dry_run", False) or getattr(args, "preview", False)
        result = "dry_run" if dry else "applied"
        return code
    except LockedError:
        result = "refused"
        raise
    finally:
        METRICS.operation(pipeline.application_id, pipeline.version, args.command, result)
        if settings.pushgateway_url:
            push(settings.pushgateway_url, pipeline.application_id, args.command)


def _run(args: argparse.Namespace, settings: Settings, pipeline: object) -> int:
    assert isinstance(pipeline, Pipeline)
    continuous = (args.trigger or pipeline.trigger_mode) != "available-now"
    if settings.driver_url and not continuous:
        # A continuous run is a long-lived process anyway: it always runs here. The
        # driver checks the pipeline against the current epoch and the application's
        # lock as a local run does (WarmDriver.run), so this client imports no Spark,
        # Arrow or Delta (about 1 s) unless it prints the report.
        from jobs.warm_driver import run_remote

        summary = run_remote(settings, pipeline)
        if not args.quiet:
            from jobs.report import print_run_report

            print_run_report(pipeline, settings, summary)
        return 0
    from jobs.delta.layout import AppLayout
    from jobs.lock import describe, holder
    from jobs.report import print_run_report
    from jobs.streaming.run import preflight, run_pipeline
    from jobs.streaming.spark import command_session

    preflight(pipeline, settings)
    # Refuse before Spark starts if the application is busy; the lock that decides
    # is taken inside run_pipeline.
    busy = holder(AppLayout(settings.warehouse, pipeline.application_id))
    if busy is not None:
        raise LockedError(
            f"application {pipeline.application_id} is busy: held by {describe(busy)}"
        )
    if settings.metrics_port is not None and continuous:
        from jobs.metrics import serve

        serve(settings.metrics_port, settings.metrics_address)
    faults.arm()
    with command_session(
        settings,
        f"platform-{pipeline.application_id}",
        runs_a_pipeline=True,
        lifetime="long" if continuous else "short",
    ) as spark:
        summary = run_pipeline(spark, pipeline, settings, args.trigger)
    if not args.quiet:
        print_run_report(pipeline, settings, summary)
    return 0


def _operation(args: argparse.Namespace, settings: Settings, pipeline: object) -> int:
    from jobs.operations.restart import plan_rebuild, plan_rewind
    from jobs.operations.runner import check_reason
    from jobs.operations.targets import REWIND_FLAGS, TargetSpec
    from jobs.pipeline.model import Pipeline

    assert isinstance(pipeline, Pipeline)
    reason = check_reason(args.reason)
    if args.command == "rebuild":
        return _plan_or_apply(
            args,
            settings,
            pipeline,
            lambda: plan_rebuild(pipeline, settings, reason, args.from_source),
        )
    if args.plan is not None:
        return _plan_or_apply(args, settings, pipeline, _saved_only)
    # argparse sets exactly one (a required group); "" is a value left blank
    given = {kind: getattr(args, flag[2:].replace("-", "_")) for kind, flag in REWIND_FLAGS.items()}
    kind, value = next((k, v) for k, v in given.items() if v not in (None, False))
    spec = TargetSpec(kind, None if value is True else str(value))
    topics = None
    if args.topics is not None:
        topics = [t.strip() for t in args.topics.split(",")]
        if not all(topics):
            raise ConfigError(f"--topics needs a value: a comma list, got {args.topics!r}")
    return _plan_or_apply(
        args,
        settings,
        pipeline,
        lambda: plan_rewind(pipeline, settings, reason, spec, args.mode, topics),
    )


def _plan_or_apply(
    args: argparse.Namespace, settings: Settings, pipeline: Pipeline, make_plan: Callable[[], Any]
) -> int:
    """``--dry-run``: plan and save; else apply (``--plan``: exactly a saved plan)."""
    from jobs.operations.runner import dry_run_operation, run_operation

    if args.dry_run:
        if args.plan is not None:
            raise ConfigError("--plan applies a saved plan: leave out --dry-run")
        dry_run_operation(pipeline, settings, make_plan, save_as=args.save_plan)
    else:
        run_operation(
            pipeline,
            settings,
            make_plan,
            plan_id=args.plan,
            operation=args.command,
            plan_digest=args.plan_digest,
        )
    return 0


def _verify(args: argparse.Namespace, settings: Settings, pipeline: Pipeline) -> int:
    from jobs.operations.verify import run_verify
    from jobs.streaming.spark import command_session

    if args.sample is not None and not 0 < args.sample <= 1:
        raise ConfigError(f"--sample must be a fraction in (0, 1], got {args.sample}")
    with command_session(settings, "verify") as spark:
        run_verify(spark, pipeline, settings, args.sample, args.source)
    return 0


def _saved_only() -> Any:
    raise ConfigError("--plan applies a saved plan; it makes none")


def _backfill(args: argparse.Namespace, settings: Settings, pipeline: object) -> int:
    from jobs.operations.backfill import run_backfill
    from jobs.operations.runner import check_reason
    from jobs.operations.targets import TargetSpec
    from jobs.pipeline.model import Pipeline
    from jobs.streaming.spark import command_session

    assert isinstance(pipeline, Pipeline)
    reason = check_reason(args.reason)
    if not 0 <= args.switch_within <= MAX_SWITCH_WITHIN:
        raise refused(
            "--switch-within", f"a record count 0-{MAX_SWITCH_WITHIN:,}", str(args.switch_within)
        )
    if args.plan is not None or args.from_earliest:
        spec = TargetSpec("earliest")  # with --plan unused: the saved plan has the offsets
    elif args.from_datetime is not None:
        spec = TargetSpec("datetime", args.from_datetime, "--from-datetime")
    else:
        spec = TargetSpec("offset", args.from_offset, "--from-offset")
    with command_session(settings, "backfill", runs_a_pipeline=True) as spark:
        run_backfill(
            spark,
            pipeline,
            settings,
            reason,
            spec,
            args.source,
            args.preview,
            plan_id=args.plan,
            plan_digest=args.plan_digest,
            save_as=args.save_plan,
            dimensions_from=args.dimensions,
            form=args.form,
            switch_within=args.switch_within,
        )
    return 0


def _storage(args: argparse.Namespace) -> int:
    from jobs import storage_server
    from jobs.warehouse import BUCKET

    if args.action == "check":
        if args.port is not None:
            raise ConfigError("--port starts the S3 server; check qualifies --warehouse")
        if not (1 <= args.rounds <= 100 and 2 <= args.writers <= 64):
            raise ConfigError("--rounds must be 1-100 and --writers 2-64")
        return _storage_check(args.warehouse, args.rounds, args.writers)
    settings = load_settings()
    data_dir = (args.data_dir or settings.storage_data_dir).resolve()
    port = _port(args.port, settings.storage_port)
    if not BUCKET.fullmatch(args.bucket):
        raise ConfigError(
            f"--bucket {args.bucket!r} is not an S3 bucket name (3-63 of a-z 0-9 . -)"
        )
    if args.action == "start":
        info = storage_server.start(data_dir, port, args.bucket)
    elif args.action == "stop":
        stopped = storage_server.stop(data_dir)
        print("S3 server stopped" if stopped else f"no S3 server running for {data_dir}")
        return 0
    else:
        found = storage_server.status(data_dir)
        if found is None:
            print(f"no S3 server running for {data_dir}")
            return 1
        info = found
    print(
        f"S3 server running: {info.endpoint} (pid {info.pid}, bucket {info.bucket}, data in "
        f"{data_dir}); its warehouse is {info.warehouse} with:"
    )
    for name, value in info.environment().items():
        print(f"export {name}={value}")
    return 0


def _storage_check(warehouse: str | None, rounds: int, writers: int) -> int:
    from jobs import storage_check
    from jobs.warehouse import Location

    if not warehouse:
        raise ConfigError("storage check needs --warehouse s3://bucket/prefix")
    findings = storage_check.check(Location.parse(warehouse), rounds, writers)
    for finding in findings:
        print(f"{'ok  ' if finding.passed else 'FAIL'} {finding.name}: {finding.detail}")
    failed = [f.name for f in findings if not f.passed]
    if failed:
        raise ConfigError(
            f"the store of {warehouse} fails {', '.join(failed)}: the platform cannot keep one "
            "writer per table on it (use a store with atomic conditional writes: AWS S3, "
            "SeaweedFS, MinIO; docs/deployment.md)"
        )
    print(f"{warehouse}: the store gives every guarantee the platform needs")
    return 0


def _broker(args: argparse.Namespace) -> int:
    from jobs import broker

    settings = load_settings()
    data_dir = (args.data_dir or settings.broker_data_dir).resolve()
    port = _port(args.port, settings.broker_port)
    if args.nodes not in (1, 3):
        raise ConfigError(f"--nodes must be 1 or 3, got {args.nodes}")
    nodes = broker.cluster_status(data_dir)
    starts_a_cluster = args.action == "start" and (args.nodes == 3 or bool(nodes))
    if starts_a_cluster and args.port is not None:
        raise ConfigError("--port starts one node; a cluster takes free loopback ports")
    if starts_a_cluster:
        cluster = broker.start_cluster(data_dir, max(args.nodes, len(nodes)))
        for n, info in cluster.nodes.items():
            print(f"node {n} running: {info.bootstrap_servers} (pid {info.pid})")
        print(f"cluster running: {cluster.bootstrap_servers} (data in {data_dir})")
    elif args.action == "start":
        info = broker.start(data_dir, port)
        print(f"broker running: {info.bootstrap_servers} (pid {info.pid}, data in {data_dir})")
    elif args.action == "stop" and nodes:
        print(f"{broker.stop_cluster(data_dir)} of {len(nodes)} nodes stopped")
    elif args.action == "stop":
        stopped = broker.stop(data_dir)
        print("broker stopped" if stopped else f"no broker running for {data_dir}")
    elif nodes:
        for n, found in nodes.items():
            print(
                f"node {n}: not running"
                if found is None
                else f"node {n} running: {found.bootstrap_servers} (pid {found.pid})"
            )
        return 0 if all(nodes.values()) else 1
    else:
        running = broker.status(data_dir)
        if running is None:
            print(f"no broker running for {data_dir}")
            return 1
        print(
            f"broker running: {running.bootstrap_servers} (pid {running.pid}, data in {data_dir})"
        )
    return 0
