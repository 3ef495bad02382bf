//! What sessions spent, by tenant, agent, session and UTC day: each
//! session's [`SessionSpend`] (a fold of its log with each record's time)
//! kept beside its log as derived data, read on from where it stopped,
//! and summed as a report asks.

use crate::error::RuntimeError;
use crate::service::Service;
use crate::session::decode;
use api::{SpendBy, SpendQuery, SpendReport, SpendRow};
use eventlog::EventLog;
use replay::spend::SessionSpend;
use replay::Totals;
use std::collections::BTreeMap;
use uuid::Uuid;

/// The name of the derived data that keeps a session's spend fold.
const SPEND: &str = "spend";

/// Version of the fold kept: another is ignored (folded again).
const SPEND_FORMAT: u16 = 1;

/// Records read at a time while a fold catches up.
const CHUNK: u64 = 4096;

#[derive(serde::Serialize, serde::Deserialize)]
struct Stored {
    format: u16,
    spend: SessionSpend,
}

/// Session `id`'s spend fold up to `head`: the one kept beside its log,
/// read on from where it stopped (or folded from the start), and kept
/// again if it moved.
pub(crate) async fn session_spend(
    log: &dyn EventLog,
    id: Uuid,
    head: u64,
) -> Result<SessionSpend, RuntimeError> {
    let kept = log.side_store().get_derived(id, SPEND).await?;
    let mut spend = kept
        .and_then(|bytes| rmp_serde::from_slice::<Stored>(&bytes).ok())
        .filter(|stored| stored.format == SPEND_FORMAT && stored.spend.seq <= head)
        .map(|stored| stored.spend)
        .unwrap_or_default();
    if spend.seq == head {
        return Ok(spend);
    }
    while spend.seq < head {
        let to = head.min(spend.seq + CHUNK);
        for record in log.read(id, spend.seq + 1, to).await? {
            let event = decode(&record)?;
            spend.apply(record.envelope.seq, record.envelope.ts_ms, &event);
        }
    }
    let stored = Stored {
        format: SPEND_FORMAT,
        spend,
    };
    let bytes = rmp_serde::to_vec_named(&stored).expect("spend always encodes");
    // Derived data: a failure only costs speed next time.
    let _ = log.side_store().put_derived(id, SPEND, &bytes).await;
    Ok(stored.spend)
}

/// One row's key: what it groups by.
type RowKey = (Option<String>, Option<String>, Option<String>, Option<Uuid>);

impl Service {
    /// Spend as `query` asks: the sessions of its tenant (or, for the
    /// operator, of every tenant and the operator's own), in rows grouped
    /// by tenant and, as `query.by` says, by agent, UTC day or session; a
    /// service acting for a tenant sees only that tenant's.
    pub async fn spend(&self, query: &SpendQuery) -> Result<SpendReport, RuntimeError> {
        let only = match (self.tenant(), &query.tenant) {
            (Some(own), Some(asked)) if *asked != own.name => {
                return Err(RuntimeError::NoSuchTenant(asked.clone()))
            }
            (Some(own), _) => Some(own.name.clone()),
            (None, asked) => asked.clone(),
        };
        let by = query.by.unwrap_or_default();
        let mut rows: BTreeMap<RowKey, Totals> = BTreeMap::new();
        let mut total = Totals::default();
        for meta in self.session_metas().await? {
            let spend = session_spend(self.log.as_ref(), meta.session, meta.events).await?;
            if only.is_some() && spend.tenant != only {
                continue;
            }
            for (day, totals) in &spend.days {
                if query.day.as_ref().is_some_and(|d| d != day) {
                    continue;
                }
                let key = (
                    spend.tenant.clone(),
                    (by == SpendBy::Agent).then(|| spend.agent.clone()),
                    (by == SpendBy::Day).then(|| day.clone()),
                    (by == SpendBy::Session).then_some(meta.session),
                );
                rows.entry(key).or_default().merge(totals);
                total.merge(totals);
            }
        }
        let row = |(tenant, agent, day, session): RowKey, totals: Totals| SpendRow {
            tenant,
            agent,
            day,
            session,
            model_calls: totals.model_calls,
            prompt_tokens: totals.prompt_tokens,
            completion_tokens: totals.completion_tokens,
            cached_tokens: totals.cached_tokens,
            cost: totals.cost,
        };
        Ok(SpendReport {
            by,
            tenant: only.clone(),
            day: query.day.clone(),
            rows: rows.into_iter().map(|(k, t)| row(k, t)).collect(),
            total: row((only, None, query.day.clone(), None), total),
        })
    }

    /// Every session of tenant `name`, in id order: by its listing's
    /// summary, or, where that cannot be read, its first records.
    pub async fn sessions_of_tenant(&self, name: &str) -> Result<Vec<Uuid>, RuntimeError> {
        let mut found = Vec::new();
        for (meta, summary) in self.listing().await? {
            let tenant = match summary {
                Ok(summary) => summary.tenant,
                Err(_) => self.tenant_of(meta.session).await.unwrap_or(None),
            };
            if tenant.as_deref() == Some(name) {
                found.push(meta.session);
            }
        }
        Ok(found)
    }

    /// The tenant session `id` belongs to (`None`: the operator's), as its
    /// start records it (a fork's copy of its parent's start, its
    /// parent's): what every request for it is checked against. Never
    /// changes once the session exists.
    pub async fn tenant_of(&self, id: Uuid) -> Result<Option<String>, RuntimeError> {
        let head = self.log.head(id).await?.seq;
        if head == 0 {
            return Err(RuntimeError::NoSuchSession(id));
        }
        for record in self.log.read(id, 1, head.min(2)).await? {
            if let replay::Event::SessionStarted { tenant, .. } = decode(&record)? {
                return Ok(tenant.map(|t| t.name));
            }
        }
        Ok(None)
    }
}
