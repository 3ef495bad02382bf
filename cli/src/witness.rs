//! Signed heads in `verify --key`, and the witness files `mneme heads`
//! writes: what a store must still hold of what a witness saw.

use crate::sessions::Sessions;
use anyhow::{bail, Context, Result};
use runtime::api::{SessionStatus, Verified};
use runtime::store::{HeadKey, Witnessed};
use std::path::Path;
use uuid::Uuid;

/// Checks session `verified.session`'s signed heads with `key`, marking
/// it failed (with why) if one does not check out or there is none.
pub(crate) async fn signed_heads(
    sessions: &dyn Sessions,
    key: &HeadKey,
    verified: &mut Verified,
) -> Result<()> {
    let id = verified.session;
    let records: Vec<(u64, String, replay::Event)> = (sessions.events(id).await?.iter())
        .map(|row| {
            let seq = row["seq"].as_u64().context("a row without a seq")?;
            let event = serde_json::from_value(row["event"].clone())
                .with_context(|| format!("seq {seq}: an event this build does not read"))?;
            Ok((
                seq,
                row["hash"].as_str().unwrap_or_default().to_string(),
                event,
            ))
        })
        .collect::<Result<_>>()?;
    let failed = |why: String, verified: &mut Verified| {
        verified.ok = false;
        verified.error = Some(format!("signed heads: {why}"));
    };
    let vouched = match key.check(id, &records) {
        Ok(vouched) => vouched,
        Err(why) => {
            failed(why, verified);
            return Ok(());
        }
    };
    let last = match vouched.at_ms {
        0 => format!(
            "{} of the history it shares with the session it was forked from",
            vouched.copied
        ),
        at => format!("the last signed {}", runtime::api::format_time(at)),
    };
    let checked = format!(
        "{} signed heads check out ({last}), vouching for seq 1–{}",
        vouched.heads + vouched.copied,
        vouched.through
    );
    match vouched.unvouched {
        None => verified.signed = Some(checked),
        // A turn under way signs when it ends.
        Some((first, last)) if running_now(sessions, id).await? => {
            verified.signed = Some(format!(
                "{checked}; seq {first}–{last} are a turn still running (signed when it ends)"
            ))
        }
        Some((first, last)) => failed(
            format!(
                "seq {first}–{last} are not vouched for: {checked}, and nothing signed after it"
            ),
            verified,
        ),
    }
    Ok(())
}

/// The signed heads session `id` holds of its own, as a witness keeps them.
pub(crate) async fn heads_of(sessions: &dyn Sessions, id: Uuid) -> Result<Vec<Witnessed>> {
    let mut heads = Vec::new();
    for row in sessions.events(id).await? {
        let event: replay::Event = serde_json::from_value(row["event"].clone())?;
        if let replay::Event::HeadSigned {
            seq,
            hash,
            at_ms,
            key,
            signature,
        } = event
        {
            let witnessed = Witnessed {
                session: id,
                seq,
                hash,
                at_ms,
                key,
                signature,
            };
            heads.push(witnessed);
        }
    }
    Ok(heads)
}

/// Checks that the store still holds every head the witness `file` saw,
/// each signed with `key`: one result per witnessed session (failed, with
/// why, if it is gone, or cut or rewritten before a witnessed head).
pub(crate) async fn witnessed(
    sessions: &dyn Sessions,
    key: &HeadKey,
    file: &Path,
) -> Result<Vec<Verified>> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let held = sessions.ids().await?;
    let mut by_session: std::collections::BTreeMap<Uuid, Vec<Witnessed>> = Default::default();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let head: Witnessed = serde_json::from_str(line)
            .with_context(|| format!("{} line {}: not a witnessed head", file.display(), n + 1))?;
        if !key.signed(&head) {
            bail!(
                "{} line {}: a head this key did not sign",
                file.display(),
                n + 1
            );
        }
        by_session.entry(head.session).or_default().push(head);
    }
    let mut results = Vec::new();
    for (id, heads) in by_session {
        let latest = heads.iter().map(|h| h.seq).max().unwrap_or(0);
        let mut verified = Verified {
            session: id,
            ok: true,
            events: None,
            head: None,
            error: None,
            signed: Some(format!(
                "the witness's {} heads, to seq {latest}, are held",
                heads.len()
            )),
        };
        let fault = match held.contains(&id) {
            false => Some(format!(
                "the witness saw it to seq {latest}; the store no longer holds it"
            )),
            true => {
                let rows = sessions.events(id).await?;
                verified.events = Some(rows.len() as u64);
                heads.iter().find_map(|head| {
                    let stored = rows.iter().find(|r| r["seq"].as_u64() == Some(head.seq));
                    let hash = stored.and_then(|r| r["hash"].as_str());
                    (hash != Some(head.hash.as_str())).then(|| match hash {
                        None => format!("the witness saw seq {} (signed {}); the store holds {} records: cut", head.seq, runtime::api::format_time(head.at_ms), rows.len()),
                        Some(_) => format!("seq {} holds another record than the witness saw (signed {}): rewritten", head.seq, runtime::api::format_time(head.at_ms)),
                    })
                })
            }
        };
        if let Some(why) = fault {
            verified.ok = false;
            verified.signed = None;
            verified.error = Some(format!("witness: {why}"));
        }
        results.push(verified);
    }
    Ok(results)
}

/// Whether a turn of session `id` runs now, under a live lease.
async fn running_now(sessions: &dyn Sessions, id: Uuid) -> Result<bool> {
    let rows = sessions.list().await?;
    let row = rows.iter().find(|r| r.session == id);
    Ok(row.is_some_and(|r| {
        r.status == SessionStatus::Running
            && r.interrupted == Some(false)
            && r.pending == Some(false)
    }))
}
