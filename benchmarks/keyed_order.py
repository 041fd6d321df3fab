"""What the keyed claim would cost if the jobs carried their keys' turn order: issue 17's unmet "claim
cost flat" target, measured against a prototype of the design docs/benchmarks.md names as its next step.

    python -m benchmarks.keyed_order                      # 1,000,000 jobs, 10,000 channels x 100 keys
    python -m benchmarks.keyed_order --quick --no-doc     # smoke run

Five databases on one server, each filled as ``benchmarks.claim_latency --scenario JOBSxCHANNELS``
fills its queue: without fair keys; with --keys keys per channel and the schema as it is (a row per key
in turn in ``channel_key``, which a claim reads, charges, and deletes when the key runs dry); the same
keyed queue with the prototype in ``_take_keyed``; with the prototype's take folded into the claim's
own statement that takes the unkeyed channels' jobs (no call of ``_take_keyed``); and with the
prototype's take plus the look-ups that priorities within a key would need (which keys the lowest
slots belong to, then each such key's jobs by priority: one index descent per key). All five run
claim_latency's steady loop (enqueue 10 jobs into random channels and keys, time one claim of 10,
finish them) in blocks of 100 rounds, taking turns block by block (the first 5 claims of a block are
not timed), after 50 warm-up rounds and a VACUUM. Prints each claim's p50 and p95 and its p50
against the unkeyed claim's.

The prototype is a measurement, not fairqueue. Each ready keyed job carries a slot, its place in its
key's turns (``running_job.key_slot``: the key's last slot + 1, set by a trigger as the job becomes
ready), and a keyed channel's share of a claim is its ready jobs in (slot, job id) order from one index.
So the keys of a channel take turns with no row per key: a key that runs dry costs nothing, and a
claim reads one index range per channel, as the unkeyed claim does. What it leaves out, and what the
design would still have to do: priorities within a key (a job's slot is fixed when it becomes ready,
so a later job of a higher priority would need the slot of the key's next turn), the ``''`` turn of a
keyed channel's jobs without a key, caps per key (which need a count per key), and a key joining at
its channel's current slot (the slot frontier would be one more column of the channel's row, written
by the claim's charge of that row). Its producers still pay what the schema's do (the key's lock and
look-up), so only the claim is compared.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

import psycopg

import fairqueue
from benchmarks._common import ROOT, parser, session
from benchmarks.claim_latency import fill
from fairqueue import migrations

BLOCK = 100
WARM_UP = 50

# The prototype, applied after the fill. Keys no longer join the turns through wakeups (their
# triggers go), and _take_keyed takes a channel's share in slot order.
PROTOTYPE = """
ALTER TABLE fairqueue.running_job ADD COLUMN key_slot bigint;
ALTER TABLE fairqueue.channel ADD COLUMN key_time bigint NOT NULL DEFAULT 0;
UPDATE fairqueue.running_job r SET key_slot = s.n
FROM (SELECT job_id, row_number() OVER (PARTITION BY channel, fair_key ORDER BY rank, job_id) - 1 AS n
      FROM fairqueue.running_job WHERE fair_key IS NOT NULL AND worker_id IS NULL) AS s
WHERE r.job_id = s.job_id;
CREATE INDEX running_job_slot_idx ON fairqueue.running_job (channel, key_slot, job_id)
    WHERE worker_id IS NULL AND fair_key IS NOT NULL;
CREATE FUNCTION fairqueue._prototype_slot() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.key_slot := coalesce(
        (SELECT r.key_slot + 1 FROM fairqueue.running_job r
         WHERE r.channel = NEW.channel AND r.fair_key = NEW.fair_key AND r.worker_id IS NULL
         ORDER BY r.channel, r.fair_key, r.rank DESC, r.job_id DESC LIMIT 1),
        (SELECT c.key_time FROM fairqueue.channel c WHERE c.name = NEW.channel), 0);
    RETURN NEW;
END $$;
CREATE TRIGGER running_job_prototype_slot BEFORE INSERT ON fairqueue.running_job
    FOR EACH ROW WHEN (NEW.fair_key IS NOT NULL) EXECUTE FUNCTION fairqueue._prototype_slot();
DROP TRIGGER running_job_key_ready ON fairqueue.running_job;
DROP TRIGGER running_job_key_released ON fairqueue.running_job;
CREATE OR REPLACE FUNCTION fairqueue._take_keyed(p_channels text[], p_ns integer[], p_caps integer[],
                                                 p_now timestamptz, OUT pos integer[], OUT ids bigint[],
                                                 OUT more boolean[], OUT locked boolean)
LANGUAGE plpgsql AS $$
BEGIN
    locked := false;
    WITH heads AS MATERIALIZED (
        SELECT u.i, coalesce(p.ids, '{}') AS ids,
               u.n > 0 AND (SELECT r.job_id FROM fairqueue.running_job r
                            WHERE r.channel = u.name AND r.worker_id IS NULL AND r.fair_key IS NOT NULL
                              AND (r.key_slot, r.job_id) > (coalesce(p.slots[cardinality(p.slots)], -1),
                                                            coalesce(p.ids[cardinality(p.ids)], 0))
                            ORDER BY r.channel, r.key_slot, r.job_id LIMIT 1) IS NOT NULL AS more
        FROM unnest(p_channels, p_ns) WITH ORDINALITY AS u(name, n, i)
        CROSS JOIN LATERAL (
            SELECT array_agg(h.job_id ORDER BY h.key_slot, h.job_id) AS ids,
                   array_agg(h.key_slot ORDER BY h.key_slot, h.job_id) AS slots
            FROM (SELECT r.job_id, r.key_slot FROM fairqueue.running_job r
                  WHERE u.n > 0 AND r.channel = u.name AND r.worker_id IS NULL AND r.fair_key IS NOT NULL
                  ORDER BY r.channel, r.key_slot, r.job_id LIMIT u.n FOR UPDATE SKIP LOCKED) AS h
        ) AS p
    ),
    taken AS (
        SELECT h.i, x.id, x.o FROM heads h CROSS JOIN LATERAL unnest(h.ids) WITH ORDINALITY AS x(id, o)
    )
    SELECT coalesce((SELECT array_agg(t.i ORDER BY t.i, t.o) FROM taken t), '{}'),
           coalesce((SELECT array_agg(t.id ORDER BY t.i, t.o) FROM taken t), '{}'),
           ARRAY(SELECT h.more FROM heads h ORDER BY h.i)
    INTO pos, ids, more;
END $$;
"""

# The same order taken in the claim's own statement that takes the unkeyed channels' jobs (the claim
# as the schema has it, with three edits): no call of _take_keyed, one index range per channel.
IN_THE_TAKE = [
    (
        """        IF true = ANY (v_keyed) THEN
            SELECT * INTO v_take FROM fairqueue._take_keyed(""",
        """        IF false THEN
            SELECT * INTO v_take FROM fairqueue._take_keyed(""",
    ),
    (
        "CASE WHEN u.keyed THEN coalesce(v_kmore[u.i], false)",
        """CASE WHEN u.keyed THEN u.n > 0 AND (SELECT r.job_id FROM fairqueue.running_job r
                         WHERE r.channel = u.name AND r.worker_id IS NULL AND r.fair_key IS NOT NULL
                           AND (r.key_slot, r.job_id) > (coalesce(k.slots[cardinality(k.slots)], -1),
                                                         coalesce(k.ids[cardinality(k.ids)], 0))
                         ORDER BY r.channel, r.key_slot, r.job_id LIMIT 1) IS NOT NULL""",
    ),
    (
        """                SELECT array_agg(x.id ORDER BY x.o) AS ids
                FROM unnest(v_kpos, v_kids) WITH ORDINALITY AS x(pos, id, o)
                WHERE u.keyed AND x.pos = u.i""",
        """                SELECT array_agg(h.job_id ORDER BY h.key_slot, h.job_id) AS ids,
                       array_agg(h.key_slot ORDER BY h.key_slot, h.job_id) AS slots
                FROM (SELECT r.job_id, r.key_slot FROM fairqueue.running_job r
                      WHERE u.n > 0 AND u.keyed AND r.channel = u.name AND r.worker_id IS NULL
                        AND r.fair_key IS NOT NULL
                      ORDER BY r.channel, r.key_slot, r.job_id LIMIT u.n FOR UPDATE SKIP LOCKED) AS h""",
    ),
]


def claim_in_the_take() -> str:
    """The claim function of the schema with IN_THE_TAKE's edits, as CREATE OR REPLACE."""
    text = (ROOT / "fairqueue" / "sql" / "schema" / "30_claim.sql").read_text()
    start = text.index("CREATE FUNCTION fairqueue.claim(")
    sql = text[start : text.index("END $$;", start) + len("END $$;")]
    for old, new in IN_THE_TAKE:
        if sql.count(old) != 1:
            raise SystemExit(f"the claim no longer has this text, update IN_THE_TAKE: {old[:60]!r}")
        sql = sql.replace(old, new)
    return sql.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


# The prototype's take with the look-ups that priorities within a key would need: which keys the
# lowest slots of a channel belong to (an index range, no lock), then each of those keys' jobs by
# priority (one index descent per key, as the schema's take does). (A job taken ahead of its slot
# would then hand its slot to the job whose turn it took; with one priority, as here, none is.)
BY_PRIORITY = """
CREATE OR REPLACE FUNCTION fairqueue._take_keyed(p_channels text[], p_ns integer[], p_caps integer[],
                                                 p_now timestamptz, OUT pos integer[], OUT ids bigint[],
                                                 OUT more boolean[], OUT locked boolean)
LANGUAGE plpgsql AS $$
BEGIN
    locked := false;
    WITH chosen AS MATERIALIZED (
        SELECT u.i, u.name, c.fair_key, count(*)::integer AS n
        FROM unnest(p_channels, p_ns) WITH ORDINALITY AS u(name, n, i)
        CROSS JOIN LATERAL (
            SELECT r.fair_key, r.key_slot, r.job_id FROM fairqueue.running_job r
            WHERE u.n > 0 AND r.channel = u.name AND r.worker_id IS NULL AND r.fair_key IS NOT NULL
            ORDER BY r.channel, r.key_slot, r.job_id LIMIT u.n
        ) AS c
        GROUP BY u.i, u.name, c.fair_key
    ),
    took AS MATERIALIZED (
        SELECT ch.i, t.job_id, t.rank
        FROM chosen ch
        CROSS JOIN LATERAL (
            SELECT r.job_id, r.rank FROM fairqueue.running_job r
            WHERE r.channel = ch.name AND r.fair_key = ch.fair_key AND r.worker_id IS NULL
            ORDER BY r.channel, r.fair_key, r.rank, r.job_id LIMIT ch.n FOR UPDATE SKIP LOCKED
        ) AS t
    ),
    heads AS (
        SELECT u.i, u.n > 0 AND (SELECT r.job_id FROM fairqueue.running_job r
                            WHERE r.channel = u.name AND r.worker_id IS NULL AND r.fair_key IS NOT NULL
                              AND r.job_id <> ALL (ARRAY(SELECT t.job_id FROM took t WHERE t.i = u.i))
                            ORDER BY r.channel, r.key_slot, r.job_id LIMIT 1) IS NOT NULL AS more
        FROM unnest(p_channels, p_ns) WITH ORDINALITY AS u(name, n, i)
    )
    SELECT coalesce((SELECT array_agg(t.i ORDER BY t.i, t.rank, t.job_id) FROM took t), '{}'),
           coalesce((SELECT array_agg(t.job_id ORDER BY t.i, t.rank, t.job_id) FROM took t), '{}'),
           ARRAY(SELECT h.more FROM heads h ORDER BY h.i)
    INTO pos, ids, more;
END $$;
"""

SYSTEMS = (
    "no keys",
    "keys (schema)",
    "keys (prototype)",
    "keys (prototype, in the take)",
    "keys (prototype, by priority)",
)


def _round(conn: psycopg.Connection[Any], worker: int, rng: random.Random, channels: int, keys: int) -> float:
    fairqueue.enqueue_many(
        conn,
        [
            fairqueue.JobSpec(
                "bench.noop",
                channel=f"tenant{rng.randrange(channels)}",
                fair_key=f"user{rng.randrange(keys)}" if keys else None,
            )
            for _ in range(10)
        ],
    )
    t = time.perf_counter()
    claimed = fairqueue.claim_batch(conn, worker, 10)
    elapsed = time.perf_counter() - t
    fairqueue.finish(conn, worker, [fairqueue.Outcome(j.id) for j in claimed])
    if len(claimed) != 10:
        raise SystemExit(f"a claim came back with {len(claimed)} jobs, not 10: use more --jobs")
    return elapsed * 1000


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__)
    p.add_argument("--jobs", type=int, default=1_000_000, help="jobs queued (default 1,000,000)")
    p.add_argument("--channels", type=int, default=10_000, help="channels (default 10,000)")
    p.add_argument("--keys", type=int, default=100, help="fair keys per channel (default 100)")
    p.add_argument("--rounds", type=int, default=1_000, help="timed rounds per system, a multiple of 100")
    args = p.parse_args(argv)
    if args.quick:
        args.jobs, args.channels, args.keys, args.rounds = 20_000, 100, 10, 200
    if args.rounds % BLOCK or args.rounds <= 0:
        raise SystemExit(f"--rounds must be a positive multiple of {BLOCK}")

    with session("keyed_order", args) as run:
        conns: dict[str, psycopg.Connection[Any]] = {}
        try:
            for n, name in enumerate(SYSTEMS):
                url = run.database(f"fairqueue_keyed_order_{n}")
                migrations.upgrade(url)
                conn = conns[name] = psycopg.connect(url, autocommit=True)
                fill(conn, args.jobs, args.channels, keys=args.keys if n else 0)
                if name.startswith("keys (prototype"):
                    conn.execute(PROTOTYPE)
                if name == "keys (prototype, in the take)":
                    conn.execute(claim_in_the_take())
                if name == "keys (prototype, by priority)":
                    conn.execute(BY_PRIORITY)
                    conn.execute("VACUUM ANALYZE fairqueue.running_job")
            state = {
                name: (fairqueue.register_worker(conns[name], "bench", lease_seconds=3600), random.Random(7))
                for name in SYSTEMS
            }
            for name in SYSTEMS:  # warm-up, then what autovacuum does in the steady state
                worker, rng = state[name]
                for _ in range(WARM_UP):
                    _round(conns[name], worker, rng, args.channels, args.keys if name != "no keys" else 0)
                for relation in ("channel_wakeup", "channel", "channel_key", "running_job", "job"):
                    conns[name].execute(f"VACUUM fairqueue.{relation}")
            timings: dict[str, list[float]] = {name: [] for name in SYSTEMS}
            for block in range(args.rounds // BLOCK):
                for k in range(len(SYSTEMS)):
                    name = SYSTEMS[(block + k) % len(SYSTEMS)]
                    worker, rng = state[name]
                    keys = args.keys if name != "no keys" else 0
                    for i in range(BLOCK):
                        ms = _round(conns[name], worker, rng, args.channels, keys)
                        if i >= 5:
                            timings[name].append(ms)
        finally:
            for conn in conns.values():
                conn.close()
        q = {name: statistics.quantiles(v, n=100, method="inclusive") for name, v in timings.items()}
        base = q["no keys"][49]
        results = {
            "jobs": args.jobs,
            "channels": args.channels,
            "keys": args.keys,
            "claims_per_system": len(timings["no keys"]),
            "claim_ms_p50": {name: round(v[49], 3) for name, v in q.items()},
            "claim_ms_p95": {name: round(v[94], 3) for name, v in q.items()},
            "p50_against_no_keys": {name: round(v[49] / base, 2) for name, v in q.items()},
        }
        table = [
            f"| claim of 10 ({args.jobs:,} queued, {args.channels:,} channels x {args.keys} keys) "
            "| p50 ms | p95 ms | p50 / no keys |",
            "|---|---:|---:|---:|",
            *(f"| {name} | {q[name][49]:.3f} | {q[name][94]:.3f} | {q[name][49] / base:.2f}x |" for name in SYSTEMS),
        ]
        run.finish(results, "The keyed claim against a prototype whose jobs carry their keys' order", table)


if __name__ == "__main__":
    main()
