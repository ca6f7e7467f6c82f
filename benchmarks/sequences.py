"""Long runs of the random repair sequences (``tests/sequences.py``) on a fresh
broker and one Spark session: each sequence drives ``inventory`` through random
operations and checks the state against the plain-Python model after every step.

    .venv/bin/python -m benchmarks.sequences [--count 20] [--seed 1] [--steps 8]
        [--windowed no|yes|alternate]   (alternate, the default: odd seeds windowed)
        [--enriched]                    (unwindowed, joined to dimension tables that
                                         are loaded, reloaded and re-pointed)
        [--check-every-step]            (verify and status after every operation)

Prints each sequence's operations and how long it took; the first failure stops
the run with its seed and the operations that led to it (rerun that seed alone).
Writes its section of docs/benchmarks.md. Not a test: it asserts only the model.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from datetime import datetime

from benchmarks.report import machine, scratch_broker, write_section
from jobs import kafka_admin
from jobs.settings import load_settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument(
        "--check-every-step",
        action="store_true",
        help="verify and status after every operation too (not only at the end)",
    )
    parser.add_argument(
        "--windowed",
        choices=["no", "yes", "alternate"],
        default="alternate",
        help="windowed pipeline (records out of order, some late): alternate = odd seeds",
    )
    parser.add_argument(
        "--enriched",
        action="store_true",
        help="enrich from two dimension tables that change under the stream (unwindowed)",
    )
    args = parser.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from tests.conftest import long_lived_session, run_jobs, run_with_fault
    from tests.sequences import run_sequence

    lines = []
    with scratch_broker("sequences-") as (work, info):
        spark = long_lived_session("sequences")
        config = kafka_admin.client_config(info.bootstrap_servers)
        started = time.monotonic()
        for seed in range(args.seed, args.seed + args.count):
            topic = f"seq{seed}"
            kafka_admin.create_topic(kafka_admin.admin(config), topic, 2)
            settings = dataclasses.replace(
                load_settings(),
                bootstrap_servers=info.bootstrap_servers,
                warehouse=work / f"warehouse-{seed}",
            )
            begun = time.monotonic()
            windowed = not args.enriched and (
                args.windowed == "yes" or (args.windowed == "alternate" and seed % 2 == 1)
            )
            done = run_sequence(
                seed,
                args.steps,
                windowed=windowed,
                enriched=args.enriched,
                check_every_step=args.check_every_step,
                spark=spark,
                settings=settings,
                kafka_config=config,
                topic=topic,
                directory=work / f"pipelines-{seed}",
                run_jobs=run_jobs,
                run_with_fault=run_with_fault,
            )
            kind = "enriched" if args.enriched else "windowed" if windowed else "unwindowed"
            line = f"seed {seed}, {kind} ({time.monotonic() - begun:.0f} s): {', '.join(done)}"
            print(line, flush=True)
            lines.append(line)
        total = time.monotonic() - started
        spark.stop()
    write_section(
        "\n".join(
            [
                "## Random repair sequences" + (" with dimension changes" if args.enriched else ""),
                "",
                f"{datetime.now():%Y-%m-%d}, {machine()}: `python -m benchmarks.sequences "
                f"--count {args.count} --seed {args.seed} --steps {args.steps}"
                f"{' --enriched' if args.enriched else ''}"
                f"{' --check-every-step' if args.check_every_step else ''}`: "
                f"{args.count} sequences, all equal to the model after every step, "
                f"{total:.0f} s.",
                "",
                *[f"- {line}" for line in lines],
            ]
        )
    )


if __name__ == "__main__":
    main()
