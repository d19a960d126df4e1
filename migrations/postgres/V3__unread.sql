-- Where each stream's general memory has read to, kept on the stream's row by every
-- cursor write of that memory, so that finding the streams with text left to read
-- (taking leases, listing unread streams) reads the pending rows of a partial index
-- instead of every stream joined with its cursor.
ALTER TABLE streams ADD COLUMN read_to BIGINT NOT NULL DEFAULT 0;

UPDATE streams SET read_to = cursors.byte_offset
FROM cursors
WHERE cursors.stream_id = streams.id AND cursors.chain = 0;

CREATE INDEX streams_unread ON streams (id) WHERE log_len > read_to;
