-- Version 4: sessions that share another session's records (a fork): its
-- records up to base_through are base_parent's, and its own start past
-- them. The first record of its own names the base too (the truth); these
-- columns find it in one lookup.
ALTER TABLE mneme_sessions ADD COLUMN base_parent uuid, ADD COLUMN base_through bigint;

-- mneme_append, whose new session may start past seq 1 on a base.
-- Returns as mneme_append does.
CREATE FUNCTION mneme_append_based(
    p_session uuid, p_first bigint, p_prev bytea, p_fence bigint,
    p_records bytea[], p_head bytea, p_created_ms bigint, p_updated_ms bigint,
    p_kind text, p_base_parent uuid, p_base_through bigint
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
    IF p_first = 1 OR p_base_parent IS NOT NULL THEN
        INSERT INTO mneme_sessions (session, head_seq, head_hash, created_ms, updated_ms,
                                    last_kind, base_parent, base_through)
        VALUES (p_session, p_first + n - 1, p_head, p_created_ms, p_updated_ms, p_kind,
                p_base_parent, p_base_through)
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
    RETURN 0;
END
$$;
