//! The engine thread: owns the model and serves memory steps and queries from a request
//! channel, one request at a time (the steps of several streams make one request, decoded
//! as one batch); each request carries the sender for its reply, so nothing waiting on
//! the model blocks the async runtime.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

use memagent_agent::{Completion, MemoryAgent};
use memagent_engine::Message;
use memagent_memory::{
    answer_with_evidence, Answer, Answered, Evidence, Ingestor, Plan, Query, ReadAhead, StepOutcome,
};
use memagent_store::{Lease, MemoryVersion};
use tokio::sync::oneshot;

/// What a step request did.
#[derive(Debug)]
pub enum Step {
    /// A chunk was read into memory and committed; `backlog`: at least a chunk's worth
    /// of bytes was left unread behind it (the stream goes on through a backlog, as
    /// the leases judge it: a chunk's tokens at [`crate::BYTES_PER_TOKEN`] bytes each).
    Done {
        outcome: Box<StepOutcome>,
        backlog: bool,
    },
    /// Less than a chunk is pending and the request asked for a full one.
    NotReady { pending_tokens: u32 },
    /// Nothing is pending.
    Nothing,
    /// Not looked at: the batch was full.
    Deferred,
}

/// Most streams stepped in one batch: the steps' prefills still run one after another,
/// so a bigger batch mostly delays the queries waiting behind it.
pub const MAX_BATCH: usize = 4;

/// A stream offered for a step: its name, whether it steps only on a whole chunk, and
/// the lease its step commits under (a database shared with other daemons).
#[derive(Debug, Clone)]
pub struct Due {
    pub stream: String,
    pub full_only: bool,
    pub lease: Option<Lease>,
}

type Reply<T> = oneshot::Sender<Result<T, String>>;

/// A request to the engine thread.
pub enum Request {
    /// Read the next chunk of each stream into its general memory, as one batch of at
    /// most [`MAX_BATCH`] (streams are looked at in order; those after a full batch are
    /// deferred); with `full_only`, a stream steps only when a whole chunk is pending.
    /// One outcome per stream, in order.
    Steps {
        streams: Vec<Due>,
        reply: Reply<Vec<Result<Step, String>>>,
    },
    /// Answer a query from its plan (read by the caller), decoded as one batch; a deep
    /// query's chains read side by side.
    Query {
        query: Box<Query>,
        plan: Plan,
        reply: Reply<Vec<Answer>>,
    },
    /// Answer questions from a memory version beside the passages found for each (the
    /// best that fit in `budget` tokens go in its prompt), decoded as one batch; each
    /// answer comes with the passages its prompt held.
    AnswerWithEvidence {
        memory: Box<MemoryVersion>,
        questions: Vec<String>,
        found: Vec<Vec<Evidence>>,
        budget: usize,
        reply: Reply<Vec<Answered>>,
    },
    /// `found` with its best `n` ranked again by the model's likelihood of `text`
    /// ([`memagent_memory::rerank`]).
    Rerank {
        text: String,
        found: Vec<Evidence>,
        n: usize,
        reply: Reply<Vec<Evidence>>,
    },
    /// A reply to a conversation (the proxy without an upstream).
    Chat {
        messages: Vec<Message>,
        max_tokens: usize,
        reply: Reply<Completion>,
    },
    /// Read these passages (a stream's newest, oldest first) ahead for [`Request::Rerank`]
    /// while no other request waits ([`ReadAhead`]), in place of those left of the last
    /// such request.
    ReadAhead { passages: Vec<String> },
}

/// What the engine thread has read ahead, for the daemon's status.
#[derive(Debug, Default)]
pub struct ReadAheadStatus {
    /// Passages read ahead since start.
    pub read: AtomicUsize,
    /// Passages left to read (or find kept) in this round.
    pub pending: AtomicUsize,
    /// Prompts kept for ranking passages again, and their bytes.
    pub kept: AtomicUsize,
    pub kept_bytes: AtomicUsize,
}

/// The sending side, cloned by the scheduler and the API.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Request>,
    read_ahead: Arc<ReadAheadStatus>,
}

/// The receiving side, served by the thread that owns the model ([`serve`]).
pub struct EngineRequests {
    rx: mpsc::Receiver<Request>,
    read_ahead: Arc<ReadAheadStatus>,
}

impl EngineHandle {
    pub fn channel() -> (Self, EngineRequests) {
        let (tx, rx) = mpsc::channel();
        let read_ahead = Arc::new(ReadAheadStatus::default());
        let requests = EngineRequests {
            rx,
            read_ahead: read_ahead.clone(),
        };
        (Self { tx, read_ahead }, requests)
    }

    /// What the engine thread has read ahead.
    pub fn read_ahead_status(&self) -> &ReadAheadStatus {
        &self.read_ahead
    }

    /// Has the engine read `passages` ahead while idle (see [`Request::ReadAhead`]);
    /// false once the engine has stopped.
    pub fn read_ahead(&self, passages: Vec<String>) -> bool {
        self.tx.send(Request::ReadAhead { passages }).is_ok()
    }

    async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Request) -> Result<T, String> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(make(reply))
            .map_err(|_| "the engine has stopped".to_string())?;
        answer
            .await
            .map_err(|_| "the engine stopped before answering".to_string())?
    }

    /// Steps of several streams, `(stream, full_only)` each, decoded as one batch.
    pub async fn steps(&self, streams: Vec<Due>) -> Result<Vec<Result<Step, String>>, String> {
        self.ask(|reply| Request::Steps { streams, reply }).await
    }

    /// Answers `query` from `plan` ([`Query::plan`]).
    pub async fn query(&self, query: Query, plan: Plan) -> Result<Vec<Answer>, String> {
        self.ask(|reply| Request::Query {
            query: Box::new(query),
            plan,
            reply,
        })
        .await
    }

    pub async fn answer_with_evidence(
        &self,
        memory: MemoryVersion,
        questions: Vec<String>,
        found: Vec<Vec<Evidence>>,
        budget: usize,
    ) -> Result<Vec<Answered>, String> {
        self.ask(|reply| Request::AnswerWithEvidence {
            memory: Box::new(memory),
            questions,
            found,
            budget,
            reply,
        })
        .await
    }

    pub async fn rerank(
        &self,
        text: String,
        found: Vec<Evidence>,
        n: usize,
    ) -> Result<Vec<Evidence>, String> {
        self.ask(|reply| Request::Rerank {
            text,
            found,
            n,
            reply,
        })
        .await
    }

    pub async fn chat(
        &self,
        messages: Vec<Message>,
        max_tokens: usize,
    ) -> Result<Completion, String> {
        self.ask(|reply| Request::Chat {
            messages,
            max_tokens,
            reply,
        })
        .await
    }
}

/// Serves requests until every sender is gone. Runs on the thread that owns the model;
/// passages to read ahead are read one at a time while no request waits.
pub fn serve(agent: &MemoryAgent<'_>, ingestor: &Ingestor<'_>, requests: EngineRequests) {
    let EngineRequests { rx, read_ahead } = requests;
    let mut ahead = ReadAhead::default();
    // Whether a backend that keeps no prompts was reported.
    let mut told_remote = false;
    let publish = |ahead: &ReadAhead| {
        read_ahead.read.store(ahead.read(), Ordering::Relaxed);
        read_ahead.pending.store(ahead.pending(), Ordering::Relaxed);
        let kept = agent.backend().scored_prompt_stats().unwrap_or_default();
        read_ahead.kept.store(kept.prompts, Ordering::Relaxed);
        read_ahead.kept_bytes.store(kept.bytes, Ordering::Relaxed);
    };
    loop {
        let request = match ahead.is_idle() {
            true => match rx.recv() {
                Ok(request) => request,
                Err(_) => break,
            },
            false => match rx.try_recv() {
                Ok(request) => request,
                Err(mpsc::TryRecvError::Empty) => {
                    if let Err(e) = ahead.step(agent.backend()) {
                        tracing::warn!("reading passages ahead: {e}");
                    }
                    if ahead.is_idle() {
                        tracing::debug!("read {} passages ahead so far", ahead.read());
                    }
                    publish(&ahead);
                    continue;
                }
                Err(mpsc::TryRecvError::Disconnected) => break,
            },
        };
        match request {
            Request::ReadAhead { passages } => match agent.backend().scored_prompt_stats() {
                Some(_) => ahead.plan(passages.iter().map(String::as_str)),
                None if !told_remote => {
                    told_remote = true;
                    tracing::warn!(
                        "read_ahead: {} keeps no prompts; passages are read ahead only with \
                         the local model (--backend local)",
                        agent.backend().model_name()
                    );
                }
                None => {}
            },
            Request::Steps { streams, reply } => {
                let _ = reply.send(Ok(steps(ingestor, &streams, agent)));
            }
            Request::Query { query, plan, reply } => {
                let answered = query.answer(plan, ingestor, &mut |_, _, _| {});
                let _ = reply.send(answered.map_err(|e| e.to_string()));
            }
            Request::AnswerWithEvidence {
                memory,
                questions,
                found,
                budget,
                reply,
            } => {
                let _ = reply.send(
                    answer_with_evidence(agent, &memory, &questions, found, budget)
                        .map_err(|e| e.to_string()),
                );
            }
            Request::Rerank {
                text,
                found,
                n,
                reply,
            } => {
                let ranked = memagent_memory::rerank(agent.backend(), &text, found, n);
                let _ = reply.send(ranked.map_err(|e| e.to_string()));
            }
            Request::Chat {
                messages,
                max_tokens,
                reply,
            } => {
                let _ = reply.send(agent.chat(&messages, max_tokens).map_err(|e| e.to_string()));
            }
        }
        publish(&ahead);
    }
}

fn steps(
    ingestor: &Ingestor<'_>,
    streams: &[Due],
    agent: &MemoryAgent<'_>,
) -> Vec<Result<Step, String>> {
    // Which streams have a chunk to read now: the chunk read here is the one stepped.
    let check = |stream: &str,
                 full_only: bool|
     -> memagent_memory::Result<Result<memagent_memory::Pending, Step>> {
        let Some(pending) = ingestor.pending(stream)? else {
            return Ok(Err(Step::Nothing));
        };
        if full_only && (pending.chunk.tokens as usize) < agent.profile.chunk_tokens {
            return Ok(Err(Step::NotReady {
                pending_tokens: pending.chunk.tokens,
            }));
        }
        Ok(Ok(pending))
    };
    let failed = |stream: &str, e: memagent_memory::Error| format!("stream `{stream}`: {e}");
    let mut outcomes: Vec<Result<Step, String>> = Vec::with_capacity(streams.len());
    let mut ready = Vec::new();
    for (i, due) in streams.iter().enumerate() {
        if ready.len() == MAX_BATCH {
            outcomes.push(Ok(Step::Deferred));
            continue;
        }
        match check(&due.stream, due.full_only) {
            Ok(Err(step)) => outcomes.push(Ok(step)),
            Ok(Ok(pending)) => {
                ready.push((i, due.stream.as_str(), pending, due.lease.as_ref()));
                outcomes.push(Ok(Step::Nothing));
            }
            Err(e) => outcomes.push(Err(failed(&due.stream, e))),
        }
    }
    // Whether a backlog is left is told by the bytes the stream held when its chunk was
    // read, without reading the stream again after the step: text appended meanwhile
    // arrives as news of its own.
    let backlog_bytes = (agent.profile.chunk_tokens * crate::BYTES_PER_TOKEN) as u64;
    let (places, read): (Vec<(usize, &str, bool)>, Vec<_>) = ready
        .into_iter()
        .map(|(i, name, pending, lease)| {
            let left = pending.stream.log_len.saturating_sub(pending.chunk.end);
            ((i, name, left >= backlog_bytes), (Ok(Some(pending)), lease))
        })
        .unzip();
    for ((i, name, backlog), outcome) in places.into_iter().zip(ingestor.step_pending(read)) {
        outcomes[i] = match outcome {
            Ok(Some(outcome)) => Ok(Step::Done {
                outcome: Box::new(outcome),
                backlog,
            }),
            Ok(None) => Ok(Step::Nothing),
            Err(e) => Err(failed(name, e)),
        };
    }
    outcomes
}
