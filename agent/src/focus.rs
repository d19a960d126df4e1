//! Focused reading in question mode: the model reads only the sentences of a chunk that
//! bear on the question, and a chunk with none leaves the memory as it was.
//!
//! A small model asked to keep one fact from a thousand tokens of unrelated text keeps
//! the text and loses the fact; from the fact's own sentence it keeps it. What bears on
//! the question is decided by words, as a person skimming for a name would:
//!
//! - when the question holds distinctive words (a name, a number, a code in capitals),
//!   a sentence bears on it when it holds one of them, and the distinctive words of every
//!   sentence kept are followed from then on, so a chain of references ("Let B hold
//!   whatever A holds") is read to its end;
//! - otherwise a sentence bears on it when it holds two of the question's words (stop
//!   words aside; one when the question has only one).

use std::collections::HashSet;

use memagent_engine::words::{keys, names, sentences};

/// What a focused reader follows through a document: the question's words and the
/// distinctive words of the sentences kept so far.
#[derive(Debug, Clone)]
pub struct Focus {
    /// Distinctive words followed (lower case, whole).
    follow: HashSet<String>,
    /// The question's word keys, when it has no distinctive word.
    wanted: Vec<String>,
    /// Every sentence kept so far, once each, in reading order.
    read: Vec<String>,
}

/// What a focused reader made of one chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Focused {
    /// The sentences kept, in the chunk's order.
    pub kept: Vec<String>,
    /// Sentences in the chunk.
    pub sentences: usize,
}

impl Focused {
    /// What the model reads: the sentences kept, one per line; `None` when none bears on
    /// the question.
    pub fn text(&self) -> Option<String> {
        (!self.kept.is_empty()).then(|| self.kept.join("\n"))
    }

    /// How the step read its chunk, for its report.
    pub fn note(&self) -> String {
        match self.kept.len() {
            0 => format!(
                "focused: none of {} sentences bears on the question; the memory stays",
                self.sentences
            ),
            n => format!(
                "focused: read {n} of {} sentences that bear on the question",
                self.sentences
            ),
        }
    }
}

impl Focus {
    pub fn new(question: &str) -> Self {
        let follow: HashSet<String> = distinctive(question, &names(question)).collect();
        let mut wanted = keys(question);
        wanted.sort_unstable();
        wanted.dedup();
        Self {
            follow,
            wanted,
            read: Vec::new(),
        }
    }

    /// Every sentence kept so far, once each, in reading order.
    pub fn read_so_far(&self) -> &[String] {
        &self.read
    }

    /// The sentences of `chunk` that bear on the question; those kept extend what is
    /// followed.
    pub fn read(&mut self, chunk: &str) -> Focused {
        let all = sentences(chunk);
        let needed = self.wanted.len().clamp(1, 2);
        let mut kept: Vec<&str> = Vec::new();
        for sentence in &all {
            let bears = if self.follow.is_empty() {
                let have = keys(sentence);
                self.wanted.iter().filter(|k| have.contains(k)).count() >= needed
            } else {
                words(sentence).any(|w| self.follow.contains(&w))
            };
            if bears {
                kept.push(sentence);
                if !self.follow.is_empty() {
                    let found: Vec<String> = distinctive(sentence, &names(sentence)).collect();
                    self.follow.extend(found);
                }
            }
        }
        for sentence in &kept {
            if !self.read.iter().any(|r| r == sentence) {
                self.read.push(sentence.to_string());
            }
        }
        Focused {
            kept: kept.into_iter().map(str::to_string).collect(),
            sentences: all.len(),
        }
    }
}

/// `memory` with each sentence of `kept` whose names, numbers and codes it lost (all of
/// the sentence's words the question shares, when it has none) added back as a line of
/// its own, while the memory stays within `fits`; and how many were added. A small
/// model's rewrite often describes what it read ("The memory holds the number for the
/// Rhine") instead of keeping it.
pub fn restore(
    memory: &str,
    kept: &[String],
    question: &str,
    fits: &mut dyn FnMut(&str) -> bool,
) -> (String, usize) {
    let mut out = memory.trim_end().to_string();
    let mut added = 0;
    let wanted = keys(question);
    for sentence in kept {
        let held: HashSet<String> = words(&out).collect();
        let mut needed: Vec<String> = distinctive(sentence, &names(sentence)).collect();
        let lost = if needed.is_empty() {
            needed = keys(sentence)
                .into_iter()
                .filter(|k| wanted.contains(k))
                .collect();
            let have = keys(&out);
            needed.iter().any(|k| !have.contains(k))
        } else {
            needed.iter().any(|w| !held.contains(w))
        };
        if !lost {
            continue;
        }
        let candidate = if out.is_empty() {
            sentence.clone()
        } else {
            format!("{out}\n{sentence}")
        };
        if fits(&candidate) {
            out = candidate;
            added += 1;
        }
    }
    (out, added)
}

/// The words of `text` as written, a possessive `'s` dropped.
fn bare(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '\'' || c == '\u{2019}'))
        .map(|w| {
            w.trim_matches(|c: char| !c.is_alphanumeric())
                .trim_end_matches("'s")
                .trim_end_matches("\u{2019}s")
        })
        .filter(|w| !w.is_empty())
}

/// The words of `text`, lower case, a possessive `'s` dropped.
fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    bare(text).map(str::to_lowercase)
}

/// The distinctive words of `text`: those holding a digit, codes of four or more capitals
/// and no small letter (shorter ones are keywords: "SET x TO y", "VAR"), and its `names`;
/// lower case.
pub(crate) fn distinctive<'t>(
    text: &'t str,
    names: &[String],
) -> impl Iterator<Item = String> + 't {
    let names: HashSet<String> = names.iter().map(|n| n.to_lowercase()).collect();
    bare(text)
        .filter(move |w| {
            if w.chars().any(|c| c.is_ascii_digit()) {
                true
            } else if w.chars().count() >= 2 && w.chars().all(char::is_uppercase) {
                w.chars().count() >= 4
            } else {
                names.contains(&w.to_lowercase())
            }
        })
        .map(str::to_lowercase)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_question_keeps_the_sentences_naming_it() {
        let mut focus = Focus::new("Which hidden number was recorded for the Danube in the text?");
        let read = focus.read(
            "Rivers were mapped by number and by hidden depth. Keep in mind that the hidden \
             number recorded for the Mekong is 1234567. Keep in mind that the hidden number \
             recorded for the Danube is 7654321. The survey ended in spring.",
        );
        assert_eq!(
            read.text().as_deref(),
            Some("Keep in mind that the hidden number recorded for the Danube is 7654321.")
        );
        assert_eq!((read.kept.len(), read.sentences), (1, 4));
        // The number found is followed from now on.
        let later = focus.read("Nothing here. Again, 7654321 was checked twice.");
        assert_eq!(
            later.text().as_deref(),
            Some("Again, 7654321 was checked twice.")
        );
    }

    #[test]
    fn a_chain_of_references_is_followed_to_its_end() {
        let mut focus = Focus::new("Which names end up holding 59952 in the text above?");
        let first = focus.read("The weather held. Let GHDVV hold 59952. Birds flew.");
        assert_eq!(first.text().as_deref(), Some("Let GHDVV hold 59952."));
        let second =
            focus.read("Let OLSCQ hold whatever GHDVV holds. Let ZZZZZ hold 11111. A quiet day.");
        assert_eq!(
            second.text().as_deref(),
            Some("Let OLSCQ hold whatever GHDVV holds.")
        );
        let third = focus.read("Let LDDNV hold whatever OLSCQ holds.");
        assert_eq!(third.kept.len(), 1);
    }

    #[test]
    fn short_capitalised_keywords_are_not_followed() {
        let mut focus = Focus::new("Name every variable whose value ends up being 59952.");
        let first = focus.read("SET GHDVV TO 59952. SET FGVPI TO ORBNY.");
        assert_eq!(first.text().as_deref(), Some("SET GHDVV TO 59952."));
        let second = focus.read("SET OLSCQ TO GHDVV. SET ZZTOP TO FGVPI.");
        assert_eq!(second.text().as_deref(), Some("SET OLSCQ TO GHDVV."));
    }

    #[test]
    fn a_question_without_names_needs_two_of_its_words() {
        let mut focus = Focus::new("Tell me the pin that goes with the hidden garden.");
        let read = focus.read(
            "The garden was green. The pin for the hidden garden is 4428. The pin for the \
             old mill is 6882.",
        );
        assert_eq!(
            read.text().as_deref(),
            Some("The pin for the hidden garden is 4428.")
        );
    }

    #[test]
    fn a_chunk_with_nothing_on_the_question_is_not_read() {
        let mut focus = Focus::new("Which hidden number was recorded for the Danube?");
        let read = focus.read("Essays on startups. Founders should talk to users.");
        assert_eq!(read.text(), None);
        assert!(read.kept.is_empty());
        assert!(
            read.note().contains("none of 2 sentences"),
            "{}",
            read.note()
        );
    }

    #[test]
    fn sentences_whose_facts_the_rewrite_lost_come_back() {
        let question = "Which names end up holding 59952 in the text above?";
        let kept = vec![
            "Let GHDVV hold 59952.".to_string(),
            "Let OLSCQ hold whatever GHDVV holds.".to_string(),
        ];
        let memory = "GHDVV holds 59952.";
        let (restored, added) = restore(memory, &kept, question, &mut |_| true);
        assert_eq!(added, 1);
        assert_eq!(
            restored,
            "GHDVV holds 59952.\nLet OLSCQ hold whatever GHDVV holds."
        );
        // Nothing lost: the memory is unchanged.
        let (same, none) = restore(&restored, &kept, question, &mut |_| true);
        assert_eq!((same.as_str(), none), (restored.as_str(), 0));
        // A sentence that would pass the cap stays out.
        let (capped, none) = restore(memory, &kept, question, &mut |m| m.len() < 30);
        assert_eq!((capped.as_str(), none), (memory, 0));
    }
}
