//! Which stream the engine reads next: a stream is due when a whole chunk is pending, or
//! when it has been idle for a while with a partial chunk (so a paused chat is still
//! remembered). Due streams are served one chunk each, in batches of up to four streams
//! decoded together; only one batch is in flight, so a query waits for at most one batch.
//!
//! A stream that received new text since its last step, or whose last step left less
//! than a chunk to read (a conversation's next turns), goes ahead of the streams still
//! working through a backlog (a folder added with years of notes), so it is read in the
//! next batch instead of after a whole round of the backlog. The backlog keeps at least
//! one place in every batch, and within each group the stream stepped least recently goes
//! first (round robin).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use memagent_recall::Recall;
use memagent_store::{Lease, MemoryVersion, StandingAnswer, Store};
use tokio::sync::{mpsc, watch};

use crate::config::WatchConfig;
use crate::engine::{Due, EngineHandle, Step, MAX_BATCH};
use crate::files::Arrival;
use crate::stats::Stats;

/// A stream whose step failed is tried again after this long.
const RETRY_AFTER: Duration = Duration::from_secs(30);

/// How often a daemon sharing its database looks for text appended through others.
const SHARED_POLL: Duration = Duration::from_secs(1);

/// Streams a daemon sharing its database holds leases on at most: enough for a few
/// batches, leaving the rest to the other daemons.
const LEASES_HELD: usize = 4 * MAX_BATCH;

pub(crate) struct Scheduler {
    pub store: Arc<Store>,
    /// The passage index: standing answers take the passages found for each question.
    pub recall: Arc<Recall>,
    pub engine: EngineHandle,
    pub stats: Arc<Mutex<Stats>>,
    pub idle: Duration,
    /// The watches with standing questions.
    pub standing: Vec<WatchConfig>,
    /// This daemon's name in the leases of a shared database.
    pub owner: String,
    /// How long a lease lasts unless renewed.
    pub lease: Duration,
    /// Unread bytes up to which a stream is leased as fresh, ahead of backlogs.
    pub fresh_bytes: u64,
}

impl Scheduler {
    /// The standing questions of `stream`: those of the watches it comes from.
    fn standing_questions(&self, stream: &str) -> Vec<String> {
        let mut questions = Vec::new();
        for watch in &self.standing {
            let ours = match &watch.stream {
                Some(name) => name == stream,
                None => self.store.files().is_ok_and(|files| {
                    files.iter().any(|f| {
                        f.stream == stream && std::path::Path::new(&f.path).starts_with(&watch.path)
                    })
                }),
            };
            if ours {
                questions.extend(watch.ask.iter().cloned());
            }
        }
        questions
    }

    /// Answers `stream`'s standing questions from its new memory, beside the passages
    /// found for each, and stores the answers with the version.
    async fn answer_standing(&self, stream: &str, memory: &MemoryVersion) {
        let questions = self.standing_questions(stream);
        if questions.is_empty() {
            return;
        }
        let found = {
            let (store, recall) = (self.store.clone(), self.recall.clone());
            let (name, asked) = (stream.to_string(), questions.clone());
            tokio::task::spawn_blocking(move || {
                asked
                    .iter()
                    .map(|q| memagent_memory::search(&store, &recall, Some(&[&name]), q, 8))
                    .collect::<memagent_memory::Result<Vec<_>>>()
            })
            .await
        };
        let found = match found {
            Ok(Ok(found)) => found,
            Ok(Err(e)) => {
                tracing::error!("{stream}: standing questions not answered: {e}");
                return;
            }
            Err(e) => {
                tracing::error!("{stream}: standing questions not answered: {e}");
                return;
            }
        };
        let answered = self
            .engine
            .answer_with_evidence(
                memory.clone(),
                questions.clone(),
                found,
                memagent_memory::EVIDENCE_TOKENS,
            )
            .await
            .map(|answers| {
                answers
                    .into_iter()
                    .map(|answered| answered.report)
                    .collect::<Vec<_>>()
            });
        let reports = match answered {
            Ok(reports) => reports,
            Err(e) => {
                tracing::error!("{stream}: standing questions not answered: {e}");
                return;
            }
        };
        let (store, name, asked, version) = (
            self.store.clone(),
            stream.to_string(),
            questions.clone(),
            memory.version,
        );
        let stored = tokio::task::spawn_blocking(move || {
            let record = store.require(&name)?;
            let created = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            for (question, report) in asked.into_iter().zip(reports) {
                let answer = StandingAnswer {
                    question,
                    version,
                    answer: report.reply,
                    created,
                    seconds: report.seconds,
                };
                store.add_answer(&record, &answer)?;
            }
            Ok::<(), memagent_store::Error>(())
        })
        .await;
        match stored {
            Ok(Ok(())) => tracing::info!(
                "{stream}: {} standing question(s) answered from memory v{}",
                questions.len(),
                memory.version
            ),
            Ok(Err(e)) => tracing::error!("{stream}: standing answers not stored: {e}"),
            Err(e) => tracing::error!("{stream}: standing answers not stored: {e}"),
        }
    }

    pub async fn run(
        self,
        mut arrivals: mpsc::UnboundedReceiver<Arrival>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut state = Rounds {
            started: Instant::now(),
            last_arrival: HashMap::new(),
            failed: HashMap::new(),
            last_step: HashMap::new(),
            backlog: HashSet::new(),
            held: HashMap::new(),
        };
        loop {
            while let Ok(arrival) = arrivals.try_recv() {
                self.arrived(&mut state.last_arrival, arrival);
            }
            if *shutdown.borrow() {
                return;
            }
            // Off the workers: a store stuck on a failing disk holds up the scheduler
            // alone, never the API.
            let (store, owner, lease) = (self.store.clone(), self.owner.clone(), self.lease);
            let (held, fresh) = (std::mem::take(&mut state.held), self.fresh_bytes);
            let leased = tokio::task::spawn_blocking(move || {
                leased_pending(&store, &owner, held, lease, fresh)
            })
            .await;
            let pending = match leased {
                Ok(Ok((pending, held))) => {
                    state.held = held;
                    pending
                }
                Ok(Err(e)) => {
                    tracing::error!("cannot list the streams: {e}");
                    Vec::new()
                }
                Err(e) => {
                    tracing::error!("cannot list the streams: {e}");
                    Vec::new()
                }
            };
            let names: Vec<String> = pending.iter().map(|(name, _)| name.clone()).collect();
            let order = state.order(&names);
            let (due, idle_ats, mut wake) = state.due(&order, self.idle);
            // A shared database: text appended through other daemons arrives unseen, and
            // leases are renewed each round: look again in time for both.
            if self.store.is_shared() {
                let again = Instant::now() + (self.lease / 3).min(SHARED_POLL);
                wake = Some(wake.map_or(again, |w| w.min(again)));
            }
            let due: Vec<Due> = due
                .into_iter()
                .map(|(stream, full_only)| {
                    let lease = pending
                        .iter()
                        .find(|(name, _)| *name == stream)
                        .map(|(_, lease)| lease.clone());
                    Due {
                        stream,
                        full_only,
                        lease,
                    }
                })
                .collect();
            let mut served = false;
            if !due.is_empty() {
                let names: Vec<&str> = due
                    .iter()
                    .take(MAX_BATCH)
                    .map(|d| d.stream.as_str())
                    .collect();
                self.stats.lock().expect("stats").busy = Some(names.join(", "));
                let sent = Instant::now();
                let outcomes = match self.engine.steps(due.clone()).await {
                    Ok(outcomes) => outcomes,
                    Err(e) => due.iter().map(|_| Err(e.clone())).collect(),
                };
                self.stats.lock().expect("stats").busy = None;
                let stepped = outcomes
                    .iter()
                    .filter(|o| matches!(o, Ok(Step::Done { .. })))
                    .count();
                if stepped > 1 {
                    tracing::info!("stepped {stepped} streams in one batch");
                }
                for ((Due { stream, .. }, idle_at), outcome) in
                    due.iter().zip(idle_ats).zip(outcomes)
                {
                    match outcome {
                        Ok(Step::Done {
                            outcome: step,
                            backlog: more,
                        }) => {
                            tracing::info!("{stream}: {step}");
                            self.stats.lock().expect("stats").stepped(stream, &step);
                            self.answer_standing(stream, &step.version).await;
                            state.stepped(stream, sent, more);
                            served = true;
                        }
                        Ok(Step::NotReady { pending_tokens }) => {
                            let mut stats = self.stats.lock().expect("stats");
                            stats
                                .streams
                                .entry(stream.clone())
                                .or_default()
                                .pending_tokens = Some(pending_tokens);
                            wake = Some(wake.map_or(idle_at, |w| w.min(idle_at)));
                        }
                        Ok(Step::Nothing) | Ok(Step::Deferred) => {}
                        Err(e) => {
                            tracing::error!("{e}; trying again in {}s", RETRY_AFTER.as_secs());
                            let mut stats = self.stats.lock().expect("stats");
                            stats.streams.entry(stream.clone()).or_default().last_error = Some(e);
                            state.failed.insert(stream.clone(), Instant::now());
                        }
                    }
                }
            }
            if served {
                continue;
            }
            let sleep = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                arrival = arrivals.recv() => match arrival {
                    Some(arrival) => self.arrived(&mut state.last_arrival, arrival),
                    None => return,
                },
                () = sleep => {}
                _ = shutdown.changed() => return,
            }
        }
    }

    fn arrived(&self, last_arrival: &mut HashMap<String, Instant>, arrival: Arrival) {
        self.stats
            .lock()
            .expect("stats")
            .arrived(&arrival.stream, arrival.log_len, arrival.at);
        last_arrival.insert(arrival.stream, arrival.at);
    }
}

/// The leases a daemon holds, by stream id.
type Held = HashMap<u64, Lease>;

/// The streams this daemon may step now, by name with their leases: the leases it
/// `held` renewed (a lost one dropped: it expired, or another daemon took the stream
/// over), more taken up to [`LEASES_HELD`] (every pending stream where the database is
/// this daemon's alone), and of those the streams with content their general memory has
/// not read; the leases of the others are given back. Also the leases now held, by
/// stream id.
fn leased_pending(
    store: &Store,
    owner: &str,
    held: Held,
    ttl: Duration,
    fresh_bytes: u64,
) -> memagent_store::Result<(Vec<(String, Lease)>, Held)> {
    let ttl_ms = ttl.as_millis() as u64;
    let held: Vec<Lease> = held.into_values().collect();
    let mut kept: Held = store
        .renew_leases(&held, ttl_ms)?
        .into_iter()
        .map(|lease| (lease.stream, lease))
        .collect();
    for lease in held {
        if !kept.contains_key(&lease.stream) {
            tracing::warn!(
                "stream {}: the lease (epoch {}) expired or was taken over; its steps go on \
                 elsewhere",
                lease.stream,
                lease.epoch
            );
        }
    }
    let room = match store.is_shared() {
        true => LEASES_HELD.saturating_sub(kept.len()),
        false => usize::MAX,
    };
    if room > 0 {
        for lease in store.take_leases(owner, room, ttl_ms, fresh_bytes)? {
            kept.insert(lease.stream, lease);
        }
    }
    let mut pending = Vec::new();
    let mut unread = HashSet::new();
    for (stream, _) in store.unread()? {
        unread.insert(stream.id);
        if let Some(lease) = kept.get(&stream.id) {
            pending.push((stream.name, lease.clone()));
        }
    }
    let read: Vec<u64> = kept
        .keys()
        .filter(|id| !unread.contains(id))
        .copied()
        .collect();
    for id in read {
        if let Some(lease) = kept.remove(&id) {
            store.release_lease(&lease)?;
        }
    }
    Ok((pending, kept))
}

/// The order in which `pending` streams (by name) are offered to the engine, which steps
/// the first [`MAX_BATCH`] that are ready. Streams with text that arrived since their
/// last step (`fresh`) come first, up to one place short of a batch while other streams
/// wait, then the others, then any other fresh streams; within each group, the stream
/// stepped least recently (`last_step`; never is earliest) first, by name on ties.
fn serve_order(
    pending: &[String],
    fresh: impl Fn(&str) -> bool,
    last_step: &HashMap<String, Instant>,
) -> Vec<String> {
    let mut order: Vec<&String> = pending.iter().collect();
    order.sort_by_key(|s| (last_step.get(*s), *s));
    let (mut first, waiting): (Vec<&String>, Vec<&String>) =
        order.into_iter().partition(|s| fresh(s));
    let ahead = if waiting.is_empty() {
        first.len()
    } else {
        first.len().min(MAX_BATCH - 1)
    };
    let after = first.split_off(ahead);
    first
        .into_iter()
        .chain(waiting)
        .chain(after)
        .cloned()
        .collect()
}

/// What the scheduler remembers from round to round.
struct Rounds {
    started: Instant,
    last_arrival: HashMap<String, Instant>,
    /// When each stream's last step failed.
    failed: HashMap<String, Instant>,
    /// When each stream's last step was sent to the engine.
    last_step: HashMap<String, Instant>,
    /// Streams whose last step left another whole chunk pending.
    backlog: HashSet<String>,
    /// The leases this daemon holds.
    held: Held,
}

impl Rounds {
    /// The `pending` streams in serving order. Fresh streams first: one step catches
    /// them up, or their text arrived since their last step; the rest are working
    /// through a backlog.
    fn order(&self, pending: &[String]) -> Vec<String> {
        let fresh = |s: &str| {
            !self.backlog.contains(s)
                || match (self.last_arrival.get(s), self.last_step.get(s)) {
                    (Some(arrived), Some(stepped)) => arrived > stepped,
                    _ => true,
                }
        };
        serve_order(pending, fresh, &self.last_step)
    }

    /// Every due stream in serving order, with whether it steps only on a whole chunk
    /// (its text arrived less than `idle` ago), and when it goes idle; and the earliest
    /// time a failed stream may be tried again. The engine steps the first ones with a
    /// chunk to read as one batch and defers the rest to the next round.
    fn due(
        &mut self,
        order: &[String],
        idle: std::time::Duration,
    ) -> (Vec<(String, bool)>, Vec<Instant>, Option<Instant>) {
        let mut wake: Option<Instant> = None;
        let mut due: Vec<(String, bool)> = Vec::new();
        let mut idle_ats = Vec::new();
        for stream in order {
            if let Some(until) = self.failed.get(stream).map(|at| *at + RETRY_AFTER) {
                if Instant::now() < until {
                    wake = Some(wake.map_or(until, |w| w.min(until)));
                    continue;
                }
                self.failed.remove(stream);
            }
            let since = self
                .last_arrival
                .get(stream)
                .copied()
                .unwrap_or(self.started);
            let idle_at = since + idle;
            due.push((stream.clone(), Instant::now() < idle_at));
            idle_ats.push(idle_at);
        }
        (due, idle_ats, wake)
    }

    /// `stream` stepped, its step sent at `sent`; `more`: another whole chunk is pending.
    fn stepped(&mut self, stream: &str, sent: Instant, more: bool) {
        self.last_step.insert(stream.to_string(), sent);
        if more {
            self.backlog.insert(stream.to_string());
        } else {
            self.backlog.remove(stream);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    /// Steps at one-second intervals, in the order given.
    fn stepped(list: &[&str]) -> HashMap<String, Instant> {
        let t0 = Instant::now();
        list.iter()
            .enumerate()
            .map(|(i, s)| (s.to_string(), t0 + Duration::from_secs(i as u64)))
            .collect()
    }

    #[test]
    fn streams_without_new_text_are_served_least_recently_stepped_first() {
        let pending = names(&["a", "b", "c", "d"]);
        let none = |_: &str| false;
        // Never stepped: by name.
        assert_eq!(serve_order(&pending, none, &HashMap::new()), pending);
        assert_eq!(
            serve_order(&pending, none, &stepped(&["c", "a", "b"])),
            names(&["d", "c", "a", "b"])
        );
    }

    #[test]
    fn new_text_goes_ahead_of_a_backlog() {
        let pending = names(&["a", "b", "chat", "d"]);
        let last = stepped(&["b", "d", "a", "chat"]);
        assert_eq!(
            serve_order(&pending, |s| s == "chat", &last),
            names(&["chat", "b", "d", "a"])
        );
    }

    #[test]
    fn a_backlog_keeps_a_place_in_every_batch() {
        let new: Vec<String> = (0..6).map(|i| format!("new{i}")).collect();
        let mut pending = new.clone();
        pending.push("old".to_string());
        let last = stepped(&["old"]);
        let fresh = |s: &str| s.starts_with("new");
        let order = serve_order(&pending, fresh, &last);
        assert_eq!(order.len(), pending.len());
        assert_eq!(order[MAX_BATCH - 1], "old");
        assert_eq!(order[..MAX_BATCH - 1], new[..MAX_BATCH - 1]);
        assert_eq!(order[MAX_BATCH..], new[MAX_BATCH - 1..]);
        // With nothing else waiting, a batch is all fresh streams.
        assert_eq!(serve_order(&new, fresh, &last), new);
    }

    #[test]
    fn fresh_streams_take_turns() {
        // Six streams that always have new text: a batch of four, then the two left out
        // go first.
        let pending: Vec<String> = (0..6).map(|i| format!("s{i}")).collect();
        let order = serve_order(&pending, |_| true, &HashMap::new());
        assert_eq!(order, pending);
        let last = stepped(&["s0", "s1", "s2", "s3"]);
        let order = serve_order(&pending, |_| true, &last);
        assert_eq!(order[..2], pending[4..]);
    }
}
