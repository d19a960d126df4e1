//! Which stream the engine reads next: a stream is due when a whole chunk is pending, or
//! when it has been idle for a while with a partial chunk (so a paused chat is still
//! remembered). Due streams are served round robin, one chunk each, in batches of up to
//! four streams decoded together; only one batch is in flight, so a query waits for at
//! most one batch.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use memagent_store::{MemoryVersion, StandingAnswer, Store, GENERAL};
use tokio::sync::{mpsc, watch};

use crate::config::WatchConfig;
use crate::engine::{EngineHandle, Step, MAX_BATCH};
use crate::files::Arrival;
use crate::stats::Stats;

/// A stream whose step failed is tried again after this long.
const RETRY_AFTER: Duration = Duration::from_secs(30);

pub(crate) struct Scheduler {
    pub store: Arc<Store>,
    pub engine: EngineHandle,
    pub stats: Arc<Mutex<Stats>>,
    pub idle: Duration,
    /// The watches with standing questions.
    pub standing: Vec<WatchConfig>,
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

    /// Answers `stream`'s standing questions from its new memory and stores the answers
    /// with the version.
    async fn answer_standing(&self, stream: &str, memory: &MemoryVersion) {
        let questions = self.standing_questions(stream);
        if questions.is_empty() {
            return;
        }
        let reports = match self.engine.answer(memory.clone(), questions.clone()).await {
            Ok(reports) => reports,
            Err(e) => {
                tracing::error!("{stream}: standing questions not answered: {e}");
                return;
            }
        };
        let stored = self.store.require(stream).and_then(|record| {
            let created = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            for (question, report) in questions.iter().zip(reports) {
                let answer = StandingAnswer {
                    question: question.clone(),
                    version: memory.version,
                    answer: report.reply,
                    created,
                    seconds: report.seconds,
                };
                self.store.add_answer(&record, &answer)?;
            }
            Ok(())
        });
        match stored {
            Ok(()) => tracing::info!(
                "{stream}: {} standing question(s) answered from memory v{}",
                questions.len(),
                memory.version
            ),
            Err(e) => tracing::error!("{stream}: standing answers not stored: {e}"),
        }
    }

    pub async fn run(
        self,
        mut arrivals: mpsc::UnboundedReceiver<Arrival>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let started = Instant::now();
        let mut last_arrival: HashMap<String, Instant> = HashMap::new();
        let mut failed: HashMap<String, Instant> = HashMap::new();
        let mut last_served: Option<String> = None;
        loop {
            while let Ok(arrival) = arrivals.try_recv() {
                self.arrived(&mut last_arrival, arrival);
            }
            if *shutdown.borrow() {
                return;
            }
            let pending = match self.pending_streams() {
                Ok(pending) => pending,
                Err(e) => {
                    tracing::error!("cannot list the streams: {e}");
                    Vec::new()
                }
            };
            // Round robin: start after the stream served last.
            let start = last_served
                .as_ref()
                .and_then(|s| pending.iter().position(|p| p == s))
                .map_or(0, |i| i + 1);
            let order = pending[start..].iter().chain(&pending[..start]);
            let mut wake: Option<Instant> = None;
            let mut served = false;
            // Every due stream in round-robin order; the engine steps the first ones
            // with a chunk to read as one batch and defers the rest to the next round.
            let mut due: Vec<(String, bool)> = Vec::new();
            let mut idle_ats = Vec::new();
            for stream in order {
                if let Some(until) = failed.get(stream).map(|at| *at + RETRY_AFTER) {
                    if Instant::now() < until {
                        wake = Some(wake.map_or(until, |w| w.min(until)));
                        continue;
                    }
                    failed.remove(stream);
                }
                let since = last_arrival.get(stream).copied().unwrap_or(started);
                let idle_at = since + self.idle;
                due.push((stream.clone(), Instant::now() < idle_at));
                idle_ats.push(idle_at);
            }
            if !due.is_empty() {
                let names: Vec<&str> = due
                    .iter()
                    .take(MAX_BATCH)
                    .map(|(s, _)| s.as_str())
                    .collect();
                self.stats.lock().expect("stats").busy = Some(names.join(", "));
                let outcomes = match self.engine.steps(due.clone()).await {
                    Ok(outcomes) => outcomes,
                    Err(e) => due.iter().map(|_| Err(e.clone())).collect(),
                };
                self.stats.lock().expect("stats").busy = None;
                let stepped = outcomes
                    .iter()
                    .filter(|o| matches!(o, Ok(Step::Done(_))))
                    .count();
                if stepped > 1 {
                    tracing::info!("stepped {stepped} streams in one batch");
                }
                for (((stream, _), idle_at), outcome) in due.iter().zip(idle_ats).zip(outcomes) {
                    match outcome {
                        Ok(Step::Done(step)) => {
                            tracing::info!("{stream}: {step}");
                            self.stats.lock().expect("stats").stepped(stream, &step);
                            self.answer_standing(stream, &step.version).await;
                            last_served = Some(stream.clone());
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
                            failed.insert(stream.clone(), Instant::now());
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
                    Some(arrival) => self.arrived(&mut last_arrival, arrival),
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

    /// Streams with content their general memory has not read, by name.
    fn pending_streams(&self) -> memagent_store::Result<Vec<String>> {
        let mut out = Vec::new();
        for stream in self.store.streams()? {
            if self.store.cursor(&stream, GENERAL)?.offset < stream.log_len {
                out.push(stream.name);
            }
        }
        Ok(out)
    }
}
