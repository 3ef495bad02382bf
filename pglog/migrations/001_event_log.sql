-- Version 1: sessions, their records, derived data and leases.

-- One row per session: where the next append goes.
CREATE TABLE mneme_sessions (
    session     uuid PRIMARY KEY,
    head_seq    bigint NOT NULL,
    head_hash   bytea  NOT NULL,
    created_ms  bigint NOT NULL,
    updated_ms  bigint NOT NULL,
    last_kind   text   NOT NULL
);

-- The records, exactly as sealed (format byte, envelope, hash).
CREATE TABLE mneme_events (
    session  uuid   NOT NULL,
    seq      bigint NOT NULL,
    record   bytea  NOT NULL,
    PRIMARY KEY (session, seq)
);

-- Snapshots and summaries: derived from the records, never the truth.
CREATE TABLE mneme_derived (
    session  uuid  NOT NULL,
    name     text  NOT NULL,
    bytes    bytea NOT NULL,
    PRIMARY KEY (session, name)
);

-- Who may write a session. A row is never deleted, so its token only grows.
CREATE TABLE mneme_leases (
    session     uuid        PRIMARY KEY,
    owner       text        NOT NULL,
    token       bigint      NOT NULL,
    expires_at  timestamptz NOT NULL,
    released    boolean     NOT NULL
);

CREATE INDEX mneme_leases_lapsed ON mneme_leases (expires_at) WHERE NOT released;

-- Appends sealed records after the session's head in one transaction.
-- Returns 0 when stored; otherwise nothing is stored and it returns
--   -1  another owner holds a live lease and the writer holds none,
--   -2  the writer's fencing token is not the session's current one,
--   n>0 the head moved: n is the seq the log would accept.
CREATE FUNCTION mneme_append(
    p_session uuid, p_first bigint, p_prev bytea, p_fence bigint,
    p_records bytea[], p_head bytea, p_created_ms bigint, p_updated_ms bigint,
    p_kind text
) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    lease mneme_leases%ROWTYPE;
    n bigint := cardinality(p_records);
    current_head bigint;
BEGIN
    -- FOR SHARE: a takeover waits until this append commits or aborts.
    SELECT * INTO lease FROM mneme_leases WHERE session = p_session FOR SHARE;
    IF FOUND THEN
        IF p_fence IS NULL THEN
            IF NOT lease.released AND lease.expires_at > clock_timestamp() THEN
                RETURN -1;
            END IF;
        ELSIF p_fence <> lease.token THEN
            RETURN -2;
        END IF;
    ELSIF p_fence IS NOT NULL THEN
        RETURN -2;
    END IF;
    IF p_first = 1 THEN
        INSERT INTO mneme_sessions (session, head_seq, head_hash, created_ms, updated_ms, last_kind)
        VALUES (p_session, n, p_head, p_created_ms, p_updated_ms, p_kind)
        ON CONFLICT (session) DO NOTHING;
    ELSE
        UPDATE mneme_sessions
        SET head_seq = head_seq + n, head_hash = p_head, updated_ms = p_updated_ms, last_kind = p_kind
        WHERE session = p_session AND head_seq = p_first - 1 AND head_hash = p_prev;
    END IF;
    IF NOT FOUND THEN
        SELECT head_seq INTO current_head FROM mneme_sessions WHERE session = p_session;
        RETURN coalesce(current_head, 0) + 1;
    END IF;
    INSERT INTO mneme_events (session, seq, record)
    SELECT p_session, p_first + i - 1, p_records[i] FROM generate_subscripts(p_records, 1) AS i;
    -- No NOTIFY here: a transaction that notifies holds a global lock through
    -- its commit, so appends could no longer share the server's WAL flushes.
    -- The writer announces committed appends itself, in batches.
    RETURN 0;
END
$$;
