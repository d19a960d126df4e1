//! Training examples from the task generators, tokenized the way the engine prompts:
//! the user message through the model's chat template (ending where the reply begins),
//! the reply followed by the end-of-turn token.

use memagent_engine::{ChatTemplate, Message, Tokenizer};
use memagent_tasks::training::{example, DataConfig, Example, Fillers, Split};

use crate::error::{Error, Result};
use crate::run::{Examples, Sequence};

/// Examples of the memory-agent workflow for one model's tokenizer and chat template.
pub struct TaskData {
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    pub config: DataConfig,
    pub train: Fillers,
    pub validation: Fillers,
    /// Longer conversations are an error (they would not fit the model's context).
    pub max_tokens: usize,
}

impl TaskData {
    pub fn example(&self, split: Split, index: u64) -> Result<Example> {
        let fillers = match split {
            Split::Train => &self.train,
            Split::Validation => &self.validation,
        };
        Ok(example(
            &self.tokenizer,
            fillers,
            &self.config,
            split,
            index,
        )?)
    }

    /// Tokens of `message` as a prompt and `target` as its reply.
    pub fn tokenize(&self, message: &str, target: &str) -> Result<Sequence> {
        let prompt = self.template.render(&[Message::user(message)], true)?;
        let mut ids = self.tokenizer.encode(&prompt, false)?;
        let target_start = ids.len();
        let end = self.tokenizer.eos_token().unwrap_or("");
        ids.extend(self.tokenizer.encode(&format!("{target}{end}"), false)?);
        if ids.len() > self.max_tokens {
            return Err(Error::Config(format!(
                "an example has {} tokens, over the limit of {}; lower --chunk-max",
                ids.len(),
                self.max_tokens
            )));
        }
        Ok(Sequence { ids, target_start })
    }
}

impl Examples for TaskData {
    fn sequence(&self, split: Split, index: u64) -> Result<Sequence> {
        let e = self.example(split, index)?;
        self.tokenize(&e.message, &e.target)
    }
}
