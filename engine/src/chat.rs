//! Chat templates: the Jinja template a model file carries (`tokenizer.chat_template`),
//! rendered with minijinja in the Hugging Face `apply_chat_template` convention.

use minijinja::{context, Environment, ErrorKind};
use serde::Serialize;

use crate::error::{Error, Result};

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

/// Gemma 3's chat format for files that carry no template (the base models): the
/// instruct models' own template, text only. A system message opens the first user turn.
pub const GEMMA3_TEMPLATE: &str = include_str!("templates/gemma3.jinja");

/// The chat template of a file without one, where its architecture has a known format.
pub fn builtin_template(architecture: &str) -> Option<&'static str> {
    match architecture {
        "gemma3" => Some(GEMMA3_TEMPLATE),
        _ => None,
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

const TEMPLATE_NAME: &str = "chat";

impl ChatTemplate {
    pub fn new(source: &str, bos_token: Option<&str>, eos_token: Option<&str>) -> Result<Self> {
        let mut env = Environment::new();
        // Python string methods (`.strip()`, `.startswith()`, ...) used by real templates.
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        // The settings of Hugging Face's `apply_chat_template` environment.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| Error::Template(format!("cannot parse the model's chat template: {e}")))?;
        Ok(Self {
            env,
            source: source.to_string(),
            bos_token: bos_token.unwrap_or_default().to_string(),
            eos_token: eos_token.unwrap_or_default().to_string(),
        })
    }

    /// The template text as stored in the model file.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders a conversation; with `add_generation_prompt` the text ends where the
    /// assistant's reply begins.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| Error::Template(e.to_string()))?;
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token,
                eos_token => self.eos_token,
            })
            .map_err(|e| Error::Template(format!("rendering failed: {e}")))
    }
}
