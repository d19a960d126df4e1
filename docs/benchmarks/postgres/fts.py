#!/usr/bin/env python3
"""PostgreSQL's own full-text search on LoCoMo's turns, for comparison with the search
each daemon keeps (tantivy BM25 + sentence vectors, `docs/recall.md`).

One turn per row ("Speaker: text", as memagent indexes a chat turn), a stored tsvector
('english': Snowball stems, stop words dropped) with a GIN index; each answerable
question asked within its conversation as an OR of its words, ranked by ts_rank and by
ts_rank_cd. Reports evidence recall as `memctl bench qa --modes search` does (the share
of an item's evidence turns among those found, at 1, 5 and 10; any@5; all@10) and the
query latency. Prints figures only: the data stays where it is (its license allows
evaluation, not copies).

    pip install 'psycopg[binary]'
    python3 docs/benchmarks/postgres/fts.py postgres://memagent@127.0.0.1:5432/postgres \
        ../shared/data/locomo-dev/locomo-dev.json
"""
import json
import re
import statistics
import sys
import time

import psycopg

ADVERSARIAL = 5


def main(url, path):
    conversations = json.load(open(path))
    with psycopg.connect(url, autocommit=True) as db:
        db.execute("DROP TABLE IF EXISTS fts_turns")
        db.execute(
            "CREATE TEMP TABLE fts_turns (conv TEXT, turn TEXT, body TEXT, "
            "tsv TSVECTOR GENERATED ALWAYS AS (to_tsvector('english', body)) STORED)"
        )
        rows = []
        for c in conversations:
            talk = c["conversation"]
            for key, turns in talk.items():
                if not re.fullmatch(r"session_\d+", key):
                    continue
                for t in turns:
                    rows.append((c["sample_id"], t["dia_id"], f"{t['speaker']}: {t['text']}"))
        with db.cursor() as cur:
            cur.executemany("INSERT INTO fts_turns (conv, turn, body) VALUES (%s, %s, %s)", rows)
        db.execute("CREATE INDEX ON fts_turns USING GIN (tsv)")
        db.execute("CREATE INDEX ON fts_turns (conv)")
        db.execute("ANALYZE fts_turns")
        size = db.execute(
            "SELECT pg_total_relation_size('fts_turns'), sum(length(body)) FROM fts_turns"
        ).fetchone()
        print(f"{len(rows)} turns, {size[1]} bytes of text, table and indexes {size[0]} bytes")
        for rank in ["ts_rank", "ts_rank_cd"]:
            measure(db, conversations, rank)


def measure(db, conversations, rank):
    sql = (
        f"SELECT turn FROM fts_turns, to_tsquery('english', %s) q "
        f"WHERE conv = %s AND tsv @@ q ORDER BY {rank}(tsv, q) DESC, turn LIMIT 10"
    )
    at = {1: [], 5: [], 10: []}
    any5, all10, ms = [], [], []
    for c in conversations:
        for qa in c["qa"]:
            if qa["category"] == ADVERSARIAL or not qa.get("evidence"):
                continue
            words = re.findall(r"[A-Za-z0-9]+", qa["question"])
            evidence = set(e.strip() for e in qa["evidence"])
            start = time.perf_counter()
            found = [r[0] for r in db.execute(sql, (" | ".join(words), c["sample_id"]))]
            ms.append(1000 * (time.perf_counter() - start))
            for k in at:
                at[k].append(len(evidence & set(found[:k])) / len(evidence))
            any5.append(bool(evidence & set(found[:5])))
            all10.append(evidence <= set(found[:10]))
    pct = lambda xs: f"{100 * sum(xs) / len(xs):.0f}%"
    ms.sort()
    print(
        f"{rank}: {len(ms)} questions; recall@1 {pct(at[1])}, recall@5 {pct(at[5])}, "
        f"any@5 {pct(any5)}, recall@10 {pct(at[10])}, all@10 {pct(all10)}; "
        f"query p50 {statistics.median(ms):.2f} ms, p99 {ms[int(0.99 * (len(ms) - 1))]:.2f} ms"
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
