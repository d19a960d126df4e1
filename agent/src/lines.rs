//! The line writer (`--writer lines`): after each chunk the model writes only the new
//! facts it states, one per line (far shorter to generate than a whole memory), and code
//! merges them into the memory:
//!
//! - a line whose normalised words equal a kept line's is a duplicate, and so is one
//!   whose sentence embedding is nearly the same as a kept line's (the caller passes the
//!   embedder; without one, words alone decide);
//! - a newer line about the same thing replaces the older in place: the same opening
//!   words with another value at the end ("Ravi lives in Graz." then "Ravi lives in
//!   Krakow."). Embeddings do not tell this apart: for all-MiniLM-L6-v2 a changed value
//!   (0.55-0.83) scores like another fact about the same person (0.55-0.61) or the same
//!   fact about another person (0.64-0.67);
//! - the model's degenerate lines (hygiene) and its NONE are dropped;
//! - a line of several sentences ("The user lives in Kyoto. The user is a nurse.") is
//!   one fact per sentence, so each is deduplicated, replaced and judged on its own.
//!
//! Only when the merged memory passes the cap M does the model rewrite it whole, to
//! compact it. The published protocol (`rewrite`) is untouched: RL-trained checkpoints
//! get it byte for byte.

use serde::Serialize;

use super::hygiene::{degenerate, line_key};
use super::protocol::{Template, NO_MEMORY};
use crate::error::Result;

/// Cosine similarity of two lines' sentence embeddings from which the newer is the
/// older said again.
pub const DUPLICATE_COSINE: f32 = 0.9;

/// Embeds texts (one vector each); the merge compares lines with it.
pub type Embed<'a> = &'a dyn Fn(&[&str]) -> Result<Vec<Vec<f32>>>;

/// What a merge did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MergeReport {
    /// New lines appended.
    pub added: usize,
    /// Older lines a newer line about the same thing replaced.
    pub replaced: usize,
    /// New lines already in the memory (same words, or the same meaning).
    pub duplicates: usize,
    /// Lines of the reply that were no fact (NONE, degenerate, under three words).
    pub dropped: usize,
}

impl MergeReport {
    /// A short account for the step's `repaired` field; `None` when nothing was dropped
    /// or merged away.
    pub fn note(&self) -> Option<String> {
        let mut parts = Vec::new();
        if self.replaced > 0 {
            parts.push(format!("{} older line(s) replaced", self.replaced));
        }
        if self.duplicates > 0 {
            parts.push(format!("{} duplicate(s) skipped", self.duplicates));
        }
        if self.dropped > 0 {
            parts.push(format!("{} non-fact line(s) dropped", self.dropped));
        }
        (!parts.is_empty()).then(|| parts.join(", "))
    }
}

/// The memory's fact lines without their numbering; none for the empty memory.
pub fn memory_lines(memory: &str) -> Vec<String> {
    if memory.trim() == NO_MEMORY.trim() {
        return Vec::new();
    }
    memory
        .lines()
        .map(line_key)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// The facts of a line-writer reply, numbering stripped, one per sentence, and how many
/// of its sentences were no fact: NONE, degenerate (hygiene), or under three words.
pub fn new_lines(reply: &str, template: Template) -> (Vec<String>, usize) {
    let mut facts = Vec::new();
    let mut dropped = 0;
    for line in reply.lines() {
        let key = line_key(line);
        if key.is_empty() {
            continue;
        }
        // A copied chat turn is judged whole: its text after "user:" may be sentences.
        if degenerate(line, template).is_some() {
            dropped += 1;
            continue;
        }
        for sentence in sentences(key) {
            let none = sentence.trim_end_matches('.').eq_ignore_ascii_case("none");
            if none || degenerate(sentence, template).is_some() || words(sentence).len() < 3 {
                dropped += 1;
            } else {
                facts.push(sentence.to_string());
            }
        }
    }
    (facts, dropped)
}

/// Words after which a full stop ends no sentence ("Dr. Okafor", "St. Louis").
const ABBREVIATIONS: &[&str] = &[
    "mr", "mrs", "ms", "dr", "st", "jr", "sr", "prof", "mt", "no", "vs", "etc", "approx",
];

/// The sentences of a line: it is cut after `.`, `!` or `?` followed by a space and a
/// capital letter or digit, unless the word before the stop is an abbreviation or one
/// letter (an initial).
pub fn sentences(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let chars: Vec<(usize, char)> = line.char_indices().collect();
    for (k, &(i, c)) in chars.iter().enumerate() {
        if !matches!(c, '.' | '!' | '?') {
            continue;
        }
        let (Some(&(_, space)), Some(&(_, next))) = (chars.get(k + 1), chars.get(k + 2)) else {
            continue;
        };
        if space != ' ' || !(next.is_uppercase() || next.is_ascii_digit()) {
            continue;
        }
        let word = line[start..i]
            .rsplit(|ch: char| !ch.is_alphanumeric())
            .next()
            .unwrap_or_default();
        if c == '.'
            && (word.chars().count() == 1 || ABBREVIATIONS.contains(&word.to_lowercase().as_str()))
        {
            continue;
        }
        let sentence = line[start..=i].trim();
        if !sentence.is_empty() {
            out.push(sentence);
        }
        start = i + 1;
    }
    let rest = line[start..].trim();
    if !rest.is_empty() {
        out.push(rest);
    }
    out
}

/// Lowercase words of a line (letters, digits and inner apostrophes).
fn words(line: &str) -> Vec<String> {
    line.split(|c: char| !(c.is_alphanumeric() || c == '\'' || c == '’'))
        .map(|w| w.trim_matches(['\'', '’']).to_lowercase())
        .filter(|w| !w.is_empty())
        .collect()
}

/// Whether `new` says the same thing as `old` with another value at its end: the same
/// opening words (at least three, and 60% of the shorter line), then at most four
/// words each that differ.
pub fn same_subject(old: &str, new: &str) -> bool {
    let (a, b) = (words(old), words(new));
    let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let shorter = a.len().min(b.len());
    shared >= 3
        && shared * 5 >= shorter * 3
        && a.len() - shared <= 4
        && b.len() - shared <= 4
        && a != b
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (norm(a) * norm(b)).max(f32::MIN_POSITIVE)
}

/// `memory` with the `new` lines merged in (see the module notes), one fact per line;
/// `memory` itself, byte for byte, when nothing was added or replaced.
pub fn merge(
    memory: &str,
    new: &[String],
    embed: Option<Embed<'_>>,
) -> Result<(String, MergeReport)> {
    let mut lines = memory_lines(memory);
    let mut report = MergeReport::default();
    let mut vectors: Vec<Option<Vec<f32>>> = vec![None; lines.len()];
    let mut new_vectors: Vec<Option<Vec<f32>>> = vec![None; new.len()];
    if let Some(embed) = embed {
        if !new.is_empty() {
            let texts: Vec<&str> = lines.iter().chain(new).map(String::as_str).collect();
            let mut all = embed(&texts)?.into_iter().map(Some);
            vectors = all.by_ref().take(lines.len()).collect();
            new_vectors = all.collect();
        }
    }
    for (line, vector) in new.iter().zip(new_vectors) {
        let key = words(line);
        if lines.iter().any(|l| words(l) == key) {
            report.duplicates += 1;
            continue;
        }
        if let Some(v) = &vector {
            let duplicate = vectors
                .iter()
                .flatten()
                .any(|old| cosine(old, v) >= DUPLICATE_COSINE);
            if duplicate {
                report.duplicates += 1;
                continue;
            }
        }
        match lines.iter().position(|old| same_subject(old, line)) {
            Some(i) => {
                lines[i] = line.clone();
                vectors[i] = vector;
                report.replaced += 1;
            }
            None => {
                lines.push(line.clone());
                vectors.push(vector);
                report.added += 1;
            }
        }
    }
    if report.added + report.replaced == 0 {
        return Ok((memory.to_string(), report));
    }
    Ok((render(&lines), report))
}

/// One fact per line (the form training's oracle memories take).
pub fn render(lines: &[String]) -> String {
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GENERAL_LINES;

    fn strings(lines: &[&str]) -> Vec<String> {
        lines.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn replies_become_fact_lines() {
        let reply = "1. Ravi lives in Graz.\n- NONE\n\n2. The the the the\nUser: hello there you\nok\n3. Bo's code is 42.";
        let (facts, dropped) = new_lines(reply, GENERAL_LINES);
        assert_eq!(facts, strings(&["Ravi lives in Graz.", "Bo's code is 42."]));
        assert_eq!(dropped, 4);
    }

    #[test]
    fn a_line_of_several_sentences_is_a_fact_per_sentence() {
        let reply = "The user's name is Marisol. The user works as a nurse. The user's name is Marisol.\nDr. Okafor lives in St. Louis. Ok.\nJ. R. Tolkien wrote it in 1937. 2 cats live here!";
        let (facts, dropped) = new_lines(reply, GENERAL_LINES);
        assert_eq!(
            facts,
            strings(&[
                "The user's name is Marisol.",
                "The user works as a nurse.",
                "The user's name is Marisol.",
                "Dr. Okafor lives in St. Louis.",
                "J. R. Tolkien wrote it in 1937.",
                "2 cats live here!",
            ])
        );
        assert_eq!(dropped, 1, "\"Ok.\" is under three words");
        assert_eq!(
            sentences("Lives at No. 5 Baker Street."),
            ["Lives at No. 5 Baker Street."]
        );
        assert_eq!(
            sentences("Version 2.5 ships. Then 3.0."),
            ["Version 2.5 ships.", "Then 3.0."]
        );
        let (memory, report) = merge(NO_MEMORY, &facts, None).unwrap();
        assert_eq!(report.duplicates, 1);
        assert_eq!(memory.lines().count(), 5, "{memory}");
    }

    #[test]
    fn new_facts_are_appended_duplicates_skipped_and_changes_replace() {
        let (memory, report) = merge(
            NO_MEMORY,
            &strings(&["Ravi lives in Graz.", "Bo's code is 42."]),
            None,
        )
        .unwrap();
        assert_eq!(memory, "Ravi lives in Graz.\nBo's code is 42.");
        assert_eq!(report.added, 2);
        let (memory, report) = merge(
            &memory,
            &strings(&[
                "ravi lives in graz",
                "Ravi lives in Krakow now.",
                "Ravi works as a nurse.",
            ]),
            None,
        )
        .unwrap();
        assert_eq!(
            memory,
            "Ravi lives in Krakow now.\nBo's code is 42.\nRavi works as a nurse."
        );
        assert_eq!(
            report,
            MergeReport {
                added: 1,
                replaced: 1,
                duplicates: 1,
                dropped: 0
            }
        );
        // Nothing new: the memory comes back byte for byte.
        let (same, report) = merge(&memory, &strings(&["Bo's code is 42."]), None).unwrap();
        assert_eq!(same, memory);
        assert_eq!(report.duplicates, 1);
    }

    #[test]
    fn the_same_opening_with_another_value_is_the_same_subject() {
        assert!(same_subject(
            "The user's cousin Lena works as a pilot.",
            "The user's cousin Lena works as a nurse."
        ));
        assert!(same_subject(
            "Carmen's brother Hiro has a dog called Milo.",
            "Carmen's brother Hiro has a dog called Mochi."
        ));
        assert!(!same_subject(
            "The user's cousin Lena works as a pilot.",
            "The user's cousin Kofi works as a pilot."
        ));
        assert!(!same_subject(
            "The user lives in Sevilla.",
            "The user's birthday is October 14."
        ));
        assert!(!same_subject(
            "Decision: book the car for May 20.",
            "Decision: book the hotel for June 2."
        ));
        assert!(!same_subject("Ravi lives in Graz.", "Ravi lives in Graz."));
    }

    #[test]
    fn near_identical_meaning_is_a_duplicate_with_an_embedder() {
        // A stand-in embedder: lines about Ingrid's birthday point one way.
        let embed = |texts: &[&str]| -> Result<Vec<Vec<f32>>> {
            Ok(texts
                .iter()
                .map(|t| {
                    if t.contains("birthday") {
                        vec![1.0, 0.0]
                    } else {
                        vec![0.0, 1.0]
                    }
                })
                .collect())
        };
        let (memory, report) = merge(
            "1. Ingrid's birthday is on March 14.",
            &strings(&[
                "The user's sister Ingrid has her birthday on March 14.",
                "Ingrid lives in Porto.",
            ]),
            Some(&embed),
        )
        .unwrap();
        assert_eq!(
            memory,
            "Ingrid's birthday is on March 14.\nIngrid lives in Porto."
        );
        assert_eq!((report.added, report.duplicates), (1, 1));
    }
}
