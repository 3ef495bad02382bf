-- Version 2: pause requests, kept with the lease they are for.

-- The token of the holding a pause was asked of and not yet taken, if any.
-- A request counts only while it names the row's current token: once the
-- lease is granted again (a new token), one left over asks nothing.
ALTER TABLE mneme_leases ADD COLUMN pause_token bigint;
