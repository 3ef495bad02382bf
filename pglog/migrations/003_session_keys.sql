-- Version 3: per-session keys (wrapped by the caller), beside the log and
-- outside its chain. Deleting a row destroys a session's key (erasure).
CREATE TABLE mneme_session_keys (
    session uuid PRIMARY KEY,
    wrapped bytea NOT NULL
);
