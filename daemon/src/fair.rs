//! A fair share of the daemon's turns among tenants.
//!
//! Every turn takes a place here before it runs (once its session is
//! its): at most `--max-running-turns` run at once across the daemon,
//! and at most a tenant's `max_running_turns` of its sessions. A turn that
//! cannot run waits in its tenant's queue; when a turn ends, the queues
//! are served round-robin, one turn a tenant at a time, each tenant's in
//! the order they were asked for. So a tenant that asks for five hundred
//! turns gets its share, and another tenant's turn waits for at most one
//! turn of each tenant ahead of it in the round, not for the five hundred.
//! The operator's own sessions are served as one more tenant.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// Whose a turn is: a tenant's name, or `None` for the operator's own.
pub(crate) type Whose = Option<String>;

/// The daemon's turns, running and waiting, by tenant.
pub(crate) struct FairShare {
    /// Turns running at once across the daemon, at most.
    most: usize,
    inner: Mutex<Inner>,
}

/// A turn waiting for its place: told when it has one.
struct Waiter {
    /// Its tenant's limit on turns running at once, when it asked.
    limit: usize,
    /// Told once the place is its; a waiter that went away (its request
    /// dropped) gives the place to the next.
    granted: oneshot::Sender<()>,
}

#[derive(Default)]
struct Inner {
    running: usize,
    by_tenant: HashMap<Whose, usize>,
    queues: HashMap<Whose, VecDeque<Waiter>>,
    /// Tenants with turns waiting, in the order the round serves them.
    round: VecDeque<Whose>,
}

/// A running turn's place: given back when dropped, to the next in the
/// round.
pub(crate) struct Place {
    fair: Arc<FairShare>,
    whose: Whose,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.fair.give_back(&self.whose);
    }
}

/// A turn waiting for its place. Dropped while it waits (the request that
/// asked for the turn went away): a place given meanwhile is given back.
struct Pending {
    fair: Arc<FairShare>,
    whose: Whose,
    told: oneshot::Receiver<()>,
    placed: bool,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.placed && self.told.try_recv().is_ok() {
            self.fair.give_back(&self.whose);
        }
    }
}

impl FairShare {
    /// At most `most` turns running at once.
    pub(crate) fn new(most: usize) -> FairShare {
        FairShare {
            most: most.max(1),
            inner: Mutex::default(),
        }
    }

    /// A place for a turn of `whose`, whose tenant runs at most `limit`
    /// turns at once: at once if one is free and none of `whose` waits,
    /// else once the round comes to it.
    pub(crate) async fn place(self: &Arc<Self>, whose: Whose, limit: usize) -> Place {
        let limit = limit.max(1);
        let waiting = {
            let mut inner = self.inner.lock().expect("fair share lock");
            let queued = inner.queues.get(&whose).is_some_and(|q| !q.is_empty());
            let own = inner.by_tenant.get(&whose).copied().unwrap_or(0);
            if !queued && inner.running < self.most && own < limit {
                inner.take(&whose);
                None
            } else {
                let (granted, told) = oneshot::channel();
                let queue = inner.queues.entry(whose.clone()).or_default();
                queue.push_back(Waiter { limit, granted });
                if !inner.round.contains(&whose) {
                    inner.round.push_back(whose.clone());
                }
                Some(told)
            }
        };
        if let Some(told) = waiting {
            let mut pending = Pending {
                fair: self.clone(),
                whose: whose.clone(),
                told,
                placed: false,
            };
            // The sender is answered or dropped only under the lock, which
            // counts the place as taken when it answers.
            let _ = (&mut pending.told).await;
            pending.placed = true;
        }
        Place {
            fair: self.clone(),
            whose,
        }
    }

    /// Turns of `whose` waiting for a place.
    pub(crate) fn queued(&self, whose: &Whose) -> usize {
        let inner = self.inner.lock().expect("fair share lock");
        inner.queues.get(whose).map_or(0, VecDeque::len)
    }

    /// Turns running now, and waiting.
    pub(crate) fn counts(&self) -> (usize, usize) {
        let inner = self.inner.lock().expect("fair share lock");
        (
            inner.running,
            inner.queues.values().map(VecDeque::len).sum(),
        )
    }

    fn give_back(&self, whose: &Whose) {
        let mut inner = self.inner.lock().expect("fair share lock");
        inner.running -= 1;
        if let Some(own) = inner.by_tenant.get_mut(whose) {
            *own -= 1;
            if *own == 0 {
                inner.by_tenant.remove(whose);
            }
        }
        inner.serve(self.most);
    }
}

impl Inner {
    fn take(&mut self, whose: &Whose) {
        self.running += 1;
        *self.by_tenant.entry(whose.clone()).or_default() += 1;
    }

    /// Gives free places to waiting turns, round-robin: each tenant in
    /// turn gets one, if it is under its own limit, until no place is free
    /// or no tenant that waits can take one.
    fn serve(&mut self, most: usize) {
        let mut passed = 0;
        while self.running < most && passed < self.round.len() {
            let Some(whose) = self.round.pop_front() else {
                break;
            };
            let own = self.by_tenant.get(&whose).copied().unwrap_or(0);
            let queue = self.queues.entry(whose.clone()).or_default();
            // Waiters that went away take no place.
            while queue.front().is_some_and(|w| w.granted.is_closed()) {
                queue.pop_front();
            }
            let granted = match queue.front() {
                Some(first) if own < first.limit => {
                    let waiter = queue.pop_front().expect("a first waiter");
                    waiter.granted.send(()).is_ok()
                }
                _ => false,
            };
            let empty = queue.is_empty();
            if empty {
                self.queues.remove(&whose);
            } else {
                self.round.push_back(whose.clone());
            }
            if granted {
                self.take(&whose);
                passed = 0;
            } else if !empty {
                // At its own limit: the next in the round.
                passed += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn tenant(name: &str) -> Whose {
        Some(name.to_string())
    }

    /// The place, if it has been given within a moment (kept by the
    /// caller: dropped, it would be given back).
    async fn given(place: &mut tokio::task::JoinHandle<Place>) -> Option<Place> {
        let given = tokio::time::timeout(Duration::from_millis(50), place).await;
        given.ok().map(|joined| joined.unwrap())
    }

    #[tokio::test]
    async fn a_tenant_runs_at_most_its_limit_and_the_daemon_its_own() {
        let fair = Arc::new(FairShare::new(3));
        let a1 = fair.place(tenant("a"), 2).await;
        let _a2 = fair.place(tenant("a"), 2).await;
        let spawn = |whose: Whose, limit| {
            let fair = fair.clone();
            tokio::spawn(async move { fair.place(whose, limit).await })
        };
        let mut a3 = spawn(tenant("a"), 2);
        assert!(given(&mut a3).await.is_none(), "a is at its limit of 2");
        let _b1 = fair.place(tenant("b"), 5).await;
        let mut b2 = spawn(tenant("b"), 5);
        assert!(given(&mut b2).await.is_none(), "the daemon is at its 3");
        assert_eq!(fair.counts(), (3, 2));
        drop(a1);
        // a's waiter and b's both wait; the round starts with a (first in),
        // and a is under its limit again.
        let _a3 = given(&mut a3).await.expect("a's turn in the round");
        assert!(given(&mut b2).await.is_none());
        assert_eq!(fair.counts(), (3, 1));
    }

    #[tokio::test]
    async fn queued_turns_are_served_round_robin_across_tenants() {
        let fair = Arc::new(FairShare::new(1));
        let running = fair.place(tenant("a"), 100).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut handles = Vec::new();
        // a floods ten turns, then b asks for one.
        for (i, whose) in (0..10).map(|i| (i, tenant("a"))).chain([(0, tenant("b"))]) {
            let (fair, order) = (fair.clone(), order.clone());
            let label = format!("{}{i}", whose.clone().unwrap());
            handles.push(tokio::spawn(async move {
                let place = fair.place(whose, 100).await;
                order.lock().unwrap().push(label);
                tokio::time::sleep(Duration::from_millis(5)).await;
                drop(place);
            }));
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert_eq!(fair.queued(&tenant("a")), 10);
        drop(running);
        for handle in handles {
            handle.await.unwrap();
        }
        let order = order.lock().unwrap().clone();
        let b_at = order.iter().position(|l| l == "b0").unwrap();
        assert!(
            b_at <= 1,
            "b served after at most one of a's ten: {order:?}"
        );
        assert_eq!(order.iter().filter(|l| l.starts_with('a')).count(), 10);
        assert_eq!(fair.counts(), (0, 0));
    }

    #[tokio::test]
    async fn a_waiter_that_went_away_takes_no_place() {
        let fair = Arc::new(FairShare::new(1));
        let running = fair.place(None, 1).await;
        let gone = {
            let fair = fair.clone();
            tokio::spawn(async move { fair.place(tenant("a"), 1).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        gone.abort();
        let _ = gone.await;
        let next = {
            let fair = fair.clone();
            tokio::spawn(async move { fair.place(tenant("b"), 1).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(running);
        let place = tokio::time::timeout(Duration::from_secs(1), next).await;
        assert!(place.is_ok(), "b got the place a's gone waiter left");
    }
}
