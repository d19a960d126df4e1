-- A change feed for the daemons' search indexes: every write of a stream's log takes the
-- next number of `log_changes` and keeps it on the stream's row (`changed`), and a
-- removed stream leaves its id with such a number in `removed_streams`. An index then
-- reads the streams changed after the last number it saw, by an index scan, instead of
-- every stream's row each time it catches up.
CREATE SEQUENCE log_changes;

ALTER TABLE streams ADD COLUMN changed BIGINT NOT NULL DEFAULT 0;

UPDATE streams SET changed = nextval('log_changes') WHERE log_len > 0;

CREATE INDEX streams_changed ON streams (changed);

CREATE TABLE removed_streams (
    id BIGINT PRIMARY KEY,
    changed BIGINT NOT NULL
);

CREATE INDEX removed_streams_changed ON removed_streams (changed);
