//! The engine thread: owns the model and serves memory steps and queries from a request
//! channel, one at a time; each request carries the sender for its reply, so nothing
//! waiting on the model blocks the async runtime.

use std::sync::mpsc;

use memagent_engine::agent::{AnswerReport, MemoryAgent};
use memagent_store::{
    general_answer, DeepAnswer, Ingestor, MemoryVersion, StepOutcome, Store, GENERAL,
};
use tokio::sync::oneshot;

/// What a step request did.
#[derive(Debug)]
pub enum Step {
    /// A chunk was read into memory and committed.
    Done(Box<StepOutcome>),
    /// Less than a chunk is pending and the request asked for a full one.
    NotReady { pending_tokens: u32 },
    /// Nothing is pending.
    Nothing,
}

type Reply<T> = oneshot::Sender<Result<T, String>>;

/// A request to the engine thread.
pub enum Request {
    /// Read the next chunk of a stream into its general memory; with `full_only`, only
    /// when a whole chunk is pending.
    Step {
        stream: String,
        full_only: bool,
        reply: Reply<Step>,
    },
    /// Answer from a memory version.
    Answer {
        memory: Box<MemoryVersion>,
        question: String,
        reply: Reply<AnswerReport>,
    },
    /// A deep query (the exact MemAgent protocol over the stored chunks).
    Deep {
        stream: String,
        question: String,
        reply: Reply<DeepAnswer>,
    },
}

/// The sending side, cloned by the scheduler and the API.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Request>,
}

impl EngineHandle {
    pub fn channel() -> (Self, mpsc::Receiver<Request>) {
        let (tx, rx) = mpsc::channel();
        (Self { tx }, rx)
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

    pub async fn step(&self, stream: &str, full_only: bool) -> Result<Step, String> {
        let stream = stream.to_string();
        self.ask(|reply| Request::Step {
            stream,
            full_only,
            reply,
        })
        .await
    }

    pub async fn answer(
        &self,
        memory: MemoryVersion,
        question: &str,
    ) -> Result<AnswerReport, String> {
        let question = question.to_string();
        self.ask(|reply| Request::Answer {
            memory: Box::new(memory),
            question,
            reply,
        })
        .await
    }

    pub async fn deep(&self, stream: &str, question: &str) -> Result<DeepAnswer, String> {
        let (stream, question) = (stream.to_string(), question.to_string());
        self.ask(|reply| Request::Deep {
            stream,
            question,
            reply,
        })
        .await
    }
}

/// Serves requests until every sender is gone. Runs on the thread that owns the model.
pub fn serve(
    agent: &MemoryAgent<'_>,
    store: &Store,
    model: &str,
    model_sha256: &str,
    requests: mpsc::Receiver<Request>,
) {
    let ingestor = Ingestor::new(store, agent, model, model_sha256);
    for request in requests {
        match request {
            Request::Step {
                stream,
                full_only,
                reply,
            } => {
                let _ = reply.send(step(&ingestor, store, &stream, full_only, agent));
            }
            Request::Answer {
                memory,
                question,
                reply,
            } => {
                let _ = reply
                    .send(general_answer(agent, &memory, &question).map_err(|e| e.to_string()));
            }
            Request::Deep {
                stream,
                question,
                reply,
            } => {
                let _ = reply.send(
                    ingestor
                        .deep(&stream, &question, &mut |_, _| {})
                        .map_err(|e| e.to_string()),
                );
            }
        }
    }
}

fn step(
    ingestor: &Ingestor<'_>,
    store: &Store,
    stream: &str,
    full_only: bool,
    agent: &MemoryAgent<'_>,
) -> Result<Step, String> {
    let run = || -> memagent_store::Result<Step> {
        let Some(record) = store.stream(stream)? else {
            return Ok(Step::Nothing);
        };
        let cursor = store.cursor(&record, GENERAL)?;
        let Some((chunk, _)) = ingestor.next_chunk(&record, &cursor)? else {
            return Ok(Step::Nothing);
        };
        if full_only && (chunk.tokens as usize) < agent.profile.chunk_tokens {
            return Ok(Step::NotReady {
                pending_tokens: chunk.tokens,
            });
        }
        Ok(match ingestor.step(stream)? {
            Some(outcome) => Step::Done(Box::new(outcome)),
            None => Step::Nothing,
        })
    };
    run().map_err(|e| format!("stream `{stream}`: {e}"))
}
