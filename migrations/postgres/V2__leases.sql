-- Which daemon reads each stream into memory: one at a time, for a while. A lease is
-- taken when free or expired (its epoch then goes up by one), renewed by its owner
-- while it works, and checked by every memory step's commit (the fence): a daemon whose
-- lease expired or was taken over cannot commit. Times are the database's clock, in
-- milliseconds since 1970, so that daemons' clocks never disagree about expiry.
CREATE TABLE leases (
    stream_id BIGINT PRIMARY KEY,
    owner TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
