//! Where the memory agent's tokens come from: a backend answers one user message, a
//! text tokenizer cuts documents into chunks. The local model is both; a remote
//! OpenAI-compatible server is a backend paired with a local or server-side tokenizer.

use std::time::Instant;

use serde::Serialize;

use crate::error::Result;
use memagent_engine::prefix::{KeptPrompt, ScoredPromptStats};
use memagent_engine::Message;
use memagent_engine::Tokenizer;
use memagent_engine::{DecodeStats, GenerateOptions, LocalModel, StopReason, Weights};

/// One reply of a backend, with its cost.
#[derive(Debug, Clone, Serialize)]
pub struct Completion {
    pub text: String,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub stop_reason: StopReason,
    pub seconds: f64,
    /// How a local model decoded the reply (absent for a remote server).
    pub decoding: Option<DecodeStats>,
    /// Prompt and generation time, when known: a local model's own clock, llama.cpp's
    /// `timings`, else the first streamed content as the end of the prompt's processing.
    pub timings: Option<Timings>,
}

/// Where a reply's time went.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Timings {
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
}

/// Generates one assistant reply to a single user message (each MemAgent step is an
/// independent one-message conversation, wrapped in the model's own chat template).
pub trait Backend {
    /// The model's name, for records and messages.
    fn model_name(&self) -> String;

    /// The model's context window in tokens, when known.
    fn context_length(&self) -> Option<usize>;

    /// Prompt tokens of `user_message` wrapped in the chat template, when the backend
    /// can count them exactly.
    fn chat_prompt_tokens(&self, user_message: &str) -> Result<Option<usize>>;

    fn complete(&self, user_message: &str, options: &GenerateOptions) -> Result<Completion>;

    /// The weights answers with `template` run with (memory steps always run with the
    /// model's adapter, when one is loaded). No adapter: the base model's.
    fn answer_weights(&self, _template: super::Template) -> Weights {
        Weights::Base
    }

    /// Replies to several independent messages: one after another unless the backend
    /// can do better (the local model decodes them as one batch, with the same replies).
    fn complete_batch(
        &self,
        user_messages: &[String],
        options: &GenerateOptions,
    ) -> Result<Vec<Completion>> {
        user_messages
            .iter()
            .map(|message| self.complete(message, options))
            .collect()
    }

    /// The mean natural log-probability of `reply`'s tokens as the reply to
    /// `user_message`, with the base model's weights (a passage ranked by the
    /// question's likelihood). Only a local model has them; a remote server's chat
    /// completions do not score a given reply.
    fn reply_log_probability(&self, _user_message: &str, _reply: &str) -> Result<f64> {
        Err(crate::Error::InvalidRequest(format!(
            "{} cannot score a given reply: ranking passages by the question's likelihood \
             needs the local model (--backend local)",
            self.model_name()
        )))
    }

    /// Reads ahead the prompt [`Backend::reply_log_probability`] reads for
    /// `user_message` and keeps it, so that a reply scored to it later reads only its own
    /// tokens (with the same result); a prompt kept already is marked as just used. `None`
    /// for a backend that keeps no prompts (a remote server).
    fn keep_scored_prompt(&self, _user_message: &str) -> Result<Option<KeptPrompt>> {
        Ok(None)
    }

    /// The prompts kept for scoring, their bytes and the most they may take; `None` for
    /// a backend that keeps none.
    fn scored_prompt_stats(&self) -> Option<ScoredPromptStats> {
        None
    }

    /// One assistant reply to a whole conversation (system, user and assistant
    /// messages). A backend without a conversation call of its own gets it as one user
    /// message, a `role: content` line per message.
    fn chat(&self, messages: &[Message], options: &GenerateOptions) -> Result<Completion> {
        let text: Vec<String> = messages
            .iter()
            .map(|m| format!("{}: {}", m.role, m.content))
            .collect();
        self.complete(&text.join("\n"), options)
    }
}

/// Token ids of plain text and back, for cutting documents into chunks.
pub trait TextTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>>;
    fn decode(&self, ids: &[u32]) -> Result<String>;
}

impl TextTokenizer for Tokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(Tokenizer::encode(self, text, false)?)
    }
    fn decode(&self, ids: &[u32]) -> Result<String> {
        Ok(Tokenizer::decode(self, ids)?)
    }
}

impl Backend for LocalModel {
    fn model_name(&self) -> String {
        self.name().to_string()
    }

    fn context_length(&self) -> Option<usize> {
        Some(LocalModel::context_length(self))
    }

    fn chat_prompt_tokens(&self, user_message: &str) -> Result<Option<usize>> {
        Ok(Some(
            self.chat_prompt_ids(&[Message::user(user_message)])?.len(),
        ))
    }

    /// Answers from passages run with the model's reader when one is loaded that learned
    /// them; a template the adapter learned, with the adapter; others with the base model.
    fn answer_weights(&self, template: super::Template) -> Weights {
        if self.reader_manifest().is_some_and(|m| {
            template.id == super::PASSAGE_ANSWER.id && super::trained_for(m, template)
        }) {
            Weights::Reader
        } else if self
            .adapter_manifest()
            .is_some_and(|m| super::trained_for(m, template))
        {
            Weights::Adapter
        } else {
            Weights::Base
        }
    }

    fn complete(&self, user_message: &str, options: &GenerateOptions) -> Result<Completion> {
        let start = Instant::now();
        let reply = self.generate_chat(&[Message::user(user_message)], options)?;
        Ok(local_completion(reply, start.elapsed().as_secs_f64()))
    }

    fn chat(&self, messages: &[Message], options: &GenerateOptions) -> Result<Completion> {
        let start = Instant::now();
        let reply = self.generate_chat(messages, options)?;
        Ok(local_completion(reply, start.elapsed().as_secs_f64()))
    }

    fn reply_log_probability(&self, user_message: &str, reply: &str) -> Result<f64> {
        Ok(LocalModel::reply_log_probability(
            self,
            &[Message::user(user_message)],
            reply,
            Weights::Base,
        )?)
    }

    fn keep_scored_prompt(&self, user_message: &str) -> Result<Option<KeptPrompt>> {
        Ok(Some(LocalModel::keep_scored_prompt(
            self,
            &[Message::user(user_message)],
            Weights::Base,
        )?))
    }

    fn scored_prompt_stats(&self) -> Option<ScoredPromptStats> {
        Some(LocalModel::scored_prompt_stats(self))
    }

    fn complete_batch(
        &self,
        user_messages: &[String],
        options: &GenerateOptions,
    ) -> Result<Vec<Completion>> {
        if user_messages.len() == 1 {
            return Ok(vec![self.complete(&user_messages[0], options)?]);
        }
        let prompts = user_messages
            .iter()
            .map(|m| self.chat_prompt_ids(&[Message::user(m)]))
            .collect::<memagent_engine::Result<Vec<_>>>()?;
        let refs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
        let replies = self.generate_batch(&refs, options)?;
        Ok(replies
            .into_iter()
            .map(|reply| {
                // A reply's own time: its prefill and its part of the shared decoding.
                let seconds = reply.prefill_seconds + reply.decode_seconds;
                local_completion(reply, seconds)
            })
            .collect())
    }
}

fn local_completion(reply: memagent_engine::Generation, seconds: f64) -> Completion {
    Completion {
        text: reply.text,
        prompt_tokens: reply.prompt_tokens,
        completion_tokens: reply.completion_tokens,
        stop_reason: reply.stop_reason,
        seconds,
        decoding: Some(reply.decoding),
        timings: Some(Timings {
            prefill_seconds: reply.prefill_seconds,
            decode_seconds: reply.decode_seconds,
        }),
    }
}
