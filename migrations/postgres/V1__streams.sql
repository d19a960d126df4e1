-- memagent's schema on PostgreSQL: the records of the embedded sled store, one table
-- each, keyed as there. Unsigned 64-bit values are stored in BIGINT with the same bits.
-- Only plain SQL that PostgreSQL-compatible distributed engines accept: no extensions,
-- no triggers, no foreign keys (a stream's rows are removed explicitly).

CREATE SEQUENCE stream_ids;

CREATE TABLE streams (
    id BIGINT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    created BIGINT NOT NULL,
    log_len BIGINT NOT NULL
);

-- A stream's content log, as appended: each piece starts where the one before ended.
CREATE TABLE log_pieces (
    stream_id BIGINT NOT NULL,
    at BIGINT NOT NULL,
    bytes BYTEA NOT NULL,
    PRIMARY KEY (stream_id, at)
);

CREATE TABLE sources (
    stream_id BIGINT NOT NULL,
    name TEXT NOT NULL,
    bytes BIGINT NOT NULL,
    sha256 BYTEA NOT NULL,
    revisions INTEGER NOT NULL,
    PRIMARY KEY (stream_id, name)
);

-- Where the log piece at `at` came from; `turns` holds (offset, line) pairs flattened.
CREATE TABLE segments (
    stream_id BIGINT NOT NULL,
    at BIGINT NOT NULL,
    source TEXT NOT NULL,
    first_line BIGINT NOT NULL,
    turns BIGINT[] NOT NULL,
    PRIMARY KEY (stream_id, at)
);

CREATE TABLE chunks (
    stream_id BIGINT NOT NULL,
    idx BIGINT NOT NULL,
    start_at BIGINT NOT NULL,
    end_at BIGINT NOT NULL,
    tokens INTEGER NOT NULL,
    sha256 BYTEA NOT NULL,
    PRIMARY KEY (stream_id, idx)
);

-- `author`: NULL when the model wrote the version, else the person's name.
CREATE TABLE versions (
    stream_id BIGINT NOT NULL,
    chain BIGINT NOT NULL,
    version BIGINT NOT NULL,
    parent BIGINT,
    text TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    chunk BIGINT,
    model TEXT NOT NULL,
    model_sha256 TEXT NOT NULL,
    template_id TEXT NOT NULL,
    template_version INTEGER NOT NULL,
    created BIGINT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    seconds DOUBLE PRECISION NOT NULL,
    cut BOOLEAN NOT NULL,
    author TEXT,
    PRIMARY KEY (stream_id, chain, version)
);

CREATE TABLE cursors (
    stream_id BIGINT NOT NULL,
    chain BIGINT NOT NULL,
    next_chunk BIGINT NOT NULL,
    byte_offset BIGINT NOT NULL,
    version BIGINT NOT NULL,
    PRIMARY KEY (stream_id, chain)
);

CREATE TABLE questions (
    stream_id BIGINT NOT NULL,
    chain BIGINT NOT NULL,
    question TEXT NOT NULL,
    PRIMARY KEY (stream_id, chain),
    UNIQUE (stream_id, question)
);

CREATE TABLE answers (
    stream_id BIGINT NOT NULL,
    version BIGINT NOT NULL,
    chain BIGINT NOT NULL,
    question TEXT NOT NULL,
    answer TEXT NOT NULL,
    created BIGINT NOT NULL,
    seconds DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (stream_id, version, chain)
);

CREATE TABLE files (
    path TEXT PRIMARY KEY,
    stream TEXT NOT NULL,
    dev BIGINT NOT NULL,
    ino BIGINT NOT NULL,
    byte_offset BIGINT NOT NULL,
    sha256 BYTEA NOT NULL,
    lines BIGINT NOT NULL,
    revisions INTEGER NOT NULL
);
