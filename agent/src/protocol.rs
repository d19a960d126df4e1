//! The prompt protocol of the memory agent: the exact MemAgent templates (the published
//! RL-MemoryAgent checkpoints were trained on them, so they are reproduced byte for byte),
//! their substitution, and answer extraction.

use serde::Serialize;

/// A prompt template with a stable identity, recorded with everything it produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Template {
    pub id: &'static str,
    pub version: u32,
    #[serde(skip)]
    pub text: &'static str,
}

/// The general memory's update step (memagent's own, not MemAgent's): query-agnostic,
/// keeps durable facts.
pub const GENERAL_UPDATE: Template = Template {
    id: "memagent-general-update",
    version: 1,
    text: include_str!("templates/general-update.txt"),
};

/// The line writer's step: only the new facts of a chunk, one per line, which code
/// merges into the general memory (`lines::merge`).
pub const GENERAL_LINES: Template = Template {
    id: "memagent-general-lines",
    version: 1,
    text: include_str!("templates/general-lines.txt"),
};

/// The line writer's compaction: the whole memory rewritten shorter, when merged lines
/// pass the cap M.
pub const GENERAL_COMPACT: Template = Template {
    id: "memagent-general-compact",
    version: 1,
    text: include_str!("templates/general-compact.txt"),
};

/// The general memory's answer step.
pub const GENERAL_ANSWER: Template = Template {
    id: "memagent-general-answer",
    version: 1,
    text: include_str!("templates/general-answer.txt"),
};

/// An answer from one passage (`{chunk}`) alone, or from the memory's notes in its
/// place: recall asks each passage found for a question and keeps the newest answer.
pub const PASSAGE_ANSWER: Template = Template {
    id: "memagent-passage-answer",
    version: 1,
    text: include_str!("templates/passage-answer.txt"),
};

/// The memory-update step of MemAgent: problem + previous memory + next chunk.
pub const UPDATE: Template = Template {
    id: "memagent-update",
    version: 1,
    text: include_str!("templates/update.txt"),
};

/// The final step of MemAgent in its RL-training form: the answer goes in `\boxed{}`.
pub const FINAL_BOXED: Template = Template {
    id: "memagent-final-boxed",
    version: 1,
    text: include_str!("templates/final-boxed.txt"),
};

/// The final step of MemAgent in its evaluation form: "Therefore, the answer is …".
pub const FINAL_EVAL: Template = Template {
    id: "memagent-final-eval",
    version: 1,
    text: include_str!("templates/final-eval.txt"),
};

/// The memory text of the very first step.
pub const NO_MEMORY: &str = include_str!("templates/no-memory.txt");

/// memagent's own single-prompt baseline: the whole document, answer in `\boxed{}`.
/// (Not part of the MemAgent protocol; shaped like its final template for comparison.)
pub const DIRECT_BOXED: Template = Template {
    id: "memagent-direct-boxed",
    version: 1,
    text: include_str!("templates/direct-boxed.txt"),
};

/// The direct baseline in the evaluation form.
pub const DIRECT_EVAL: Template = Template {
    id: "memagent-direct-eval",
    version: 1,
    text: include_str!("templates/direct-eval.txt"),
};

/// Which final template answers from the memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FinalForm {
    /// `final-boxed`: answer inside `\boxed{}` (the RL checkpoints' training form).
    #[default]
    Boxed,
    /// `final-eval`: "Therefore, the answer is …".
    Eval,
}

impl FinalForm {
    pub fn final_template(self) -> Template {
        match self {
            Self::Boxed => FINAL_BOXED,
            Self::Eval => FINAL_EVAL,
        }
    }

    pub fn direct_template(self) -> Template {
        match self {
            Self::Boxed => DIRECT_BOXED,
            Self::Eval => DIRECT_EVAL,
        }
    }
}

impl std::str::FromStr for FinalForm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "boxed" | "final-boxed" => Ok(Self::Boxed),
            "eval" | "final-eval" => Ok(Self::Eval),
            other => Err(format!(
                "unknown final template `{other}`; expected boxed or eval"
            )),
        }
    }
}

impl Template {
    /// The template with `{prompt}`, `{memory}` and `{chunk}` replaced by the given
    /// texts, wherever the template has them. Markers are looked up in the template
    /// only, so a document that itself contains `{memory}` is inserted verbatim. Markers
    /// a template lacks are ignored.
    pub fn fill(&self, prompt: &str, memory: &str, chunk: &str) -> String {
        let mut marks: Vec<(usize, &str, &str)> = [
            ("{prompt}", prompt),
            ("{memory}", memory),
            ("{chunk}", chunk),
        ]
        .into_iter()
        .flat_map(|(marker, value)| {
            self.text
                .match_indices(marker)
                .map(move |(at, _)| (at, marker, value))
        })
        .collect();
        marks.sort_by_key(|(at, _, _)| *at);
        let mut out =
            String::with_capacity(self.text.len() + prompt.len() + memory.len() + chunk.len());
        let mut from = 0;
        for (at, marker, value) in marks {
            out.push_str(&self.text[from..at]);
            out.push_str(value);
            from = at + marker.len();
        }
        out.push_str(&self.text[from..]);
        out
    }
}

/// The memory a reply holds: what follows the last `</think>` of a reasoning model,
/// else the whole reply.
pub fn memory_text(reply: &str) -> &str {
    match reply.rfind("</think>") {
        Some(at) => reply[at + "</think>".len()..].trim_start(),
        None => reply,
    }
}

/// The answer in a final reply: the content of the last `\boxed{…}` (nested braces
/// allowed), else what follows the last "the answer is", else the whole reply, trimmed.
pub fn extract_answer(reply: &str) -> String {
    let reply = memory_text(reply);
    if let Some(boxed) = last_boxed(reply) {
        return boxed.trim().to_string();
    }
    let lower = reply.to_lowercase();
    const PHRASE: &str = "the answer is";
    // Lower-casing can change byte lengths outside ASCII; only trust a match at a char
    // boundary of the original that spells the phrase (ASCII, so lengths agree).
    if let Some(at) = lower.rfind(PHRASE).filter(|&at| {
        reply
            .get(at..at + PHRASE.len())
            .is_some_and(|s| s.eq_ignore_ascii_case(PHRASE))
    }) {
        let rest = reply[at + PHRASE.len()..].trim();
        let rest = rest.strip_prefix(':').unwrap_or(rest).trim();
        let rest = rest.trim_end_matches(['.', ' ', '\n']);
        return rest.to_string();
    }
    reply.trim().to_string()
}

/// The content of the last complete `\boxed{…}`.
fn last_boxed(text: &str) -> Option<&str> {
    let mut found = None;
    let mut search = 0;
    while let Some(rel) = text[search..].find("\\boxed{") {
        let open = search + rel + "\\boxed{".len();
        let mut depth = 1usize;
        let mut close = None;
        for (i, c) in text[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = Some(open + i);
                        break;
                    }
                }
                _ => {}
            }
        }
        match close {
            Some(end) => {
                found = Some(&text[open..end]);
                search = end;
            }
            None => break,
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_replaces_every_marker_of_the_template_and_keeps_markers_in_values() {
        let out = UPDATE.fill("Q {chunk}", "M", "C {memory}");
        assert!(out.contains("<problem> \nQ {chunk}\n</problem>"));
        assert!(out.contains("<memory>\nM\n</memory>"));
        assert!(out.contains("<section>\nC {memory}\n</section>"));
        assert!(out.ends_with("Updated memory:\n"));
    }

    #[test]
    fn a_marker_the_template_repeats_is_filled_each_time() {
        let out = PASSAGE_ANSWER.fill("Who? {prompt}", "M", "P");
        assert!(out.starts_with("Question: Who? {prompt}\n"), "{out}");
        assert!(out.ends_with("Question: Who? {prompt}\nAnswer:\n"), "{out}");
        assert_eq!(out.matches("Who?").count(), 2);
    }

    #[test]
    fn final_template_keeps_literal_braces() {
        let out = FINAL_BOXED.fill("Q", "M", "ignored");
        assert!(out.contains("put the answer in \\boxed{}."));
        assert!(!out.contains("ignored"));
    }

    #[test]
    fn answers_are_extracted_like_the_reference() {
        assert_eq!(
            extract_answer("so \\boxed{12} or \\boxed{1234567}."),
            "1234567"
        );
        assert_eq!(extract_answer("\\boxed{\\frac{1}{2}}"), "\\frac{1}{2}");
        assert_eq!(extract_answer("Therefore, the answer is Paris."), "Paris");
        assert_eq!(extract_answer("The answer is: 42\n"), "42");
        assert_eq!(extract_answer("  just text "), "just text");
        assert_eq!(extract_answer(""), "");
        assert_eq!(extract_answer("unclosed \\boxed{42"), "unclosed \\boxed{42");
        assert_eq!(extract_answer("<think>\\boxed{1}</think> \\boxed{2}"), "2");
    }

    #[test]
    fn memory_keeps_what_follows_the_last_think() {
        assert_eq!(memory_text("<think>a</think>b</think> kept"), "kept");
        assert_eq!(memory_text("plain"), "plain");
    }
}
