//! Training examples from the task generators, tokenized the way the engine prompts:
//! the user message through the model's chat template (ending where the reply begins),
//! the reply followed by the end-of-turn token.

use std::collections::HashSet;
use std::path::Path;

use memagent_engine::{ChatTemplate, Config, GgufFile, Message, Tokenizer};
use memagent_tasks::training::{example, DataConfig, Example, Fillers, Split};
use memagent_tasks::Haystack;

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
    /// Loss weight of what an update step adds (lines its memory did not hold: new facts,
    /// changed values) and of the end of its reply; copied lines weigh 1. Copying the
    /// memory is most of every target, while noticing a fact and stopping are the
    /// decisions that keep or lose it.
    pub new_fact_weight: f32,
}

impl TaskData {
    /// The tokenizer, chat template and context of the GGUF model at `model`, with the
    /// training fillers (`essays` when given) and the validation split's own.
    pub fn from_gguf(
        model: &Path,
        config: DataConfig,
        essays: Option<Haystack>,
        new_fact_weight: f32,
    ) -> Result<Self> {
        let gguf = GgufFile::open(model)?;
        let tokenizer = Tokenizer::from_gguf(&gguf)?;
        let source = gguf
            .opt_string("tokenizer.chat_template")?
            .ok_or_else(|| Error::Config(format!("{} has no chat template", model.display())))?;
        let template = ChatTemplate::new(source, tokenizer.bos_token(), tokenizer.eos_token())?;
        Ok(Self {
            tokenizer,
            template,
            config,
            train: Fillers::new(Split::Train, essays)?,
            validation: Fillers::new(Split::Validation, None)?,
            max_tokens: Config::from_gguf(&gguf)?.context_length,
            new_fact_weight,
        })
    }

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

    /// Tokens of `message` as the engine prompts with it: the chat template's user turn,
    /// ending where the reply begins.
    pub fn prompt_ids(&self, message: &str) -> Result<Vec<u32>> {
        let prompt = self.template.render(&[Message::user(message)], true)?;
        Ok(self.tokenizer.encode(&prompt, false)?)
    }

    /// Tokens of `message` as a prompt and `target` as its reply, weighted against
    /// `memory_before` (an update step's memory; `None`: every token weighs 1).
    pub fn tokenize(
        &self,
        message: &str,
        target: &str,
        memory_before: Option<&str>,
    ) -> Result<Sequence> {
        let mut ids = self.prompt_ids(message)?;
        let target_start = ids.len();
        let end = self.tokenizer.eos_token().unwrap_or("");
        let (reply, weights) = self.weighted_reply(target, end, memory_before)?;
        ids.extend(reply);
        if ids.len() > self.max_tokens {
            return Err(Error::Config(format!(
                "an example has {} tokens, over the limit of {}; lower --chunk-max",
                ids.len(),
                self.max_tokens
            )));
        }
        Ok(Sequence {
            ids,
            target_start,
            weights,
        })
    }

    /// The reply's tokens, line by line, with the weight of each.
    fn weighted_reply(
        &self,
        target: &str,
        end: &str,
        memory_before: Option<&str>,
    ) -> Result<(Vec<u32>, Vec<f32>)> {
        let whole = self.tokenizer.encode(&format!("{target}{end}"), false)?;
        let Some(before) = memory_before.filter(|_| self.new_fact_weight != 1.0) else {
            let n = whole.len();
            return Ok((whole, vec![1.0; n]));
        };
        let held: HashSet<&str> = before.lines().map(str::trim).collect();
        let (mut ids, mut weights) = (Vec::new(), Vec::new());
        for (i, line) in target.split('\n').enumerate() {
            let piece = if i == 0 {
                line.to_string()
            } else {
                format!("\n{line}")
            };
            let w = if held.contains(line.trim()) {
                1.0
            } else {
                self.new_fact_weight
            };
            let t = self.tokenizer.encode(&piece, false)?;
            weights.extend(std::iter::repeat_n(w, t.len()));
            ids.extend(t);
        }
        let t = self.tokenizer.encode(end, false)?;
        weights.extend(std::iter::repeat_n(self.new_fact_weight, t.len()));
        ids.extend(t);
        // Byte-level BPE splits at line breaks, so the pieces give the whole's tokens; a
        // tokenizer that merges across them gets uniform weights instead.
        if ids != whole {
            let n = whole.len();
            return Ok((whole, vec![1.0; n]));
        }
        Ok((ids, weights))
    }
}

impl Examples for TaskData {
    fn sequence(&self, split: Split, index: u64) -> Result<Sequence> {
        let e = self.example(split, index)?;
        self.tokenize(&e.message, &e.target, e.memory_before.as_deref())
    }
}
