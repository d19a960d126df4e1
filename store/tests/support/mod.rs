//! What the store's tests share.

use memagent_store::{Author, MemoryVersion};

mod database;

#[allow(unused_imports)] // used by the tests on PostgreSQL only
pub use database::fresh_database;

/// A memory version written by a person, with `text`.
pub fn person_version(text: &str) -> MemoryVersion {
    MemoryVersion {
        version: 0,
        parent: None,
        text: text.to_string(),
        tokens: 3,
        chunk: None,
        model: String::new(),
        model_sha256: String::new(),
        template_id: String::new(),
        template_version: 0,
        created: 0,
        prompt_tokens: 0,
        completion_tokens: 0,
        seconds: 0.0,
        cut: false,
        author: Author::Person {
            name: "ada".to_string(),
        },
    }
}
