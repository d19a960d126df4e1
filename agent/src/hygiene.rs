//! Memory hygiene, whatever the model: a new memory keeps one copy of each line
//! (numbering and bullets ignored when comparing) and none of the degenerate lines a
//! small model writes — a span of words repeating inside a line ("spouse's spouse's
//! spouse's"), a chat turn copied with its role ("User: Please remember this: your"), a
//! line of the instructions — nor the unfinished line a cut at M tokens leaves. A memory
//! that comes back empty, as an echo of the instructions, or with nothing but degenerate
//! lines is replaced by the previous one. A well-formed memory passes byte for byte, so a
//! good model's output is never altered.

pub use memagent_engine::words::{line_key, repeated_last_line};

use super::protocol::Template;

/// `memory` with every line whose key already appeared dropped (blank lines are kept),
/// and how many were dropped. Returns the input unchanged when nothing repeats.
pub fn dedupe_lines(memory: &str) -> (String, usize) {
    let mut seen = std::collections::HashSet::new();
    let mut kept = Vec::new();
    let mut dropped = 0;
    for line in memory.split('\n') {
        let key = line_key(line);
        if key.is_empty() || seen.insert(key) {
            kept.push(line);
        } else {
            dropped += 1;
        }
    }
    if dropped == 0 {
        (memory.to_string(), 0)
    } else {
        (kept.join("\n"), dropped)
    }
}

/// Whether every non-blank line of `memory` is a line of the template's own text (the
/// instructions and the markers around its slots): the model echoed its prompt.
pub fn is_echo(memory: &str, template: Template) -> bool {
    let own: std::collections::HashSet<&str> = template_lines(template).collect();
    let mut lines = memory
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .peekable();
    lines.peek().is_some() && lines.all(|l| own.contains(l) || own.contains(line_key(l)))
}

/// Why a memory line is degenerate, or `None` for a line worth keeping.
pub fn degenerate(line: &str, template: Template) -> Option<&'static str> {
    let key = line_key(line);
    if key.is_empty() {
        return None;
    }
    if repeats_a_span(key) {
        return Some("repeat a span of words");
    }
    if says_nothing(key) {
        return Some("state nothing");
    }
    if is_chat_turn(key) {
        return Some("copy a chat turn");
    }
    if speaks_of_the_memory(key) && !names_anything(key) {
        return Some("speak of the memory instead of its content");
    }
    if template_lines(template).any(|l| l == key || line_key(l) == key)
        || quotes_instructions(key, template)
    {
        return Some("repeat the instructions");
    }
    None
}

/// Running words of the template's text (its slots left out) that a line of memory may
/// not quote: "The section contains a reference to a section of an article that may
/// contain the answer to the problem." says nothing the chunk said.
const QUOTED_WORDS: usize = 6;

/// Whether `line` holds [`QUOTED_WORDS`] running words of the template's own text.
fn quotes_instructions(line: &str, template: Template) -> bool {
    let words = |text: &str| -> Vec<String> {
        text.split(|c: char| !(c.is_alphanumeric() || c == '\''))
            .filter(|w| !w.is_empty())
            .map(str::to_lowercase)
            .collect()
    };
    let line = words(line);
    if line.len() < QUOTED_WORDS {
        return false;
    }
    let own: Vec<String> = template
        .text
        .split('{')
        .map(|part| part.split_once('}').map_or(part, |(_, rest)| rest))
        .flat_map(|part| {
            // Each stretch of text between slots on its own: no run spans a slot.
            let w = words(part);
            (0..w.len().saturating_sub(QUOTED_WORDS - 1))
                .map(|i| w[i..i + QUOTED_WORDS].join(" "))
                .collect::<Vec<_>>()
        })
        .collect();
    line.windows(QUOTED_WORDS)
        .any(|run| own.contains(&run.join(" ")))
}

/// The template's own lines: its instructions and the markers around its slots.
fn template_lines(template: Template) -> impl Iterator<Item = &'static str> {
    template
        .text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.contains('{'))
}

/// Whether a run of 1-6 words comes three times in a row ("spouse's spouse's spouse's",
/// "is the is the is the"), or a unit of 2-4 characters three times in a row inside a
/// word ("1.11.1.1.1"), digits alone excepted (1,000,000 is a number).
fn repeats_a_span(line: &str) -> bool {
    let words: Vec<&str> = line.split_whitespace().collect();
    for n in 1..=6 {
        if words.len() < 3 * n {
            break;
        }
        for start in 0..=words.len() - 3 * n {
            let span = &words[start..start + n];
            if (1..3).all(|k| &words[start + k * n..start + (k + 1) * n] == span) {
                return true;
            }
        }
    }
    words.iter().any(|w| {
        let b = w.as_bytes();
        (2..=4).any(|unit| {
            b.len() >= 3 * unit
                && (0..=b.len() - 3 * unit).any(|i| {
                    let u = &b[i..i + unit];
                    !u.iter().all(u8::is_ascii_digit)
                        && (1..3).all(|k| &b[i + k * unit..i + (k + 1) * unit] == u)
                })
        })
    })
}

/// Whether a line only restates its subject: "The user's neighbour is the user's
/// neighbour.", "The user's neighbour is the user's neighbour's neighbour.", or chains a
/// possessive onto the same word ("the neighbour's neighbour's").
fn says_nothing(line: &str) -> bool {
    let lower = line.trim_end_matches(['.', '!', ' ']).to_lowercase();
    let words: Vec<&str> = lower.split_whitespace().collect();
    let chained = words
        .windows(2)
        .any(|w| w[0] == w[1] && (w[0].ends_with("'s") || w[0].ends_with("’s")));
    let strip = |s: &str| {
        let s = s.trim();
        ["the ", "a ", "an "]
            .iter()
            .find_map(|a| s.strip_prefix(a))
            .unwrap_or(s)
            .to_string()
    };
    let restated = lower.split_once(" is ").is_some_and(|(subject, rest)| {
        let (subject, rest) = (strip(subject), strip(rest));
        !subject.is_empty() && (rest == subject || rest.starts_with(&format!("{subject}'s")))
    });
    chained || restated
}

/// Whether a line speaks of the memory rather than of what it read ("The previous memory
/// contains the names of …", "The new memory is:"): the prompt's own words about its
/// slots, which a small model repeats in place of the facts.
fn speaks_of_the_memory(line: &str) -> bool {
    let lower = line.to_lowercase();
    let rest = lower.strip_prefix("the ").unwrap_or(&lower);
    let rest = ["previous ", "new ", "updated ", "current ", "old "]
        .iter()
        .find_map(|w| rest.strip_prefix(w))
        .unwrap_or(rest);
    let Some(after) = rest.strip_prefix("memory") else {
        return false;
    };
    let after = after.trim_start();
    let verb = after
        .split(|c: char| !c.is_alphabetic())
        .next()
        .unwrap_or("");
    after.is_empty()
        || after.starts_with([':', '.'])
        || [
            "contains", "is", "was", "has", "had", "includes", "holds", "now", "remains", "says",
            "states", "lists", "mentions", "shows",
        ]
        .contains(&verb)
}

/// Whether `line`, quotations aside, holds a name, a number or a code: a line about
/// the memory that names what it holds ("The previous memory contains the names of
/// NODVR and FZJUW.") still says something.
fn names_anything(line: &str) -> bool {
    let mut outside = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            '\u{201C}' => quoted = true,
            '\u{201D}' => quoted = false,
            c if !quoted => outside.push(c),
            _ => {}
        }
    }
    let found = super::focus::distinctive(&outside, &memagent_engine::words::names(&outside))
        .next()
        .is_some();
    found
}

/// Whether a line is a chat turn as a log renders it: an optional `[time]`, a role, an
/// optional `(name)`, a colon ("User: …", "[2026-03-01] assistant (Ada): …").
fn is_chat_turn(line: &str) -> bool {
    let mut s = line;
    // A time in brackets, whole or with its start cut off ("23] user: …").
    if let Some(i) = s
        .find("] ")
        .filter(|&i| i <= 32 && !s[..i].contains(':') || s.starts_with('['))
    {
        s = &s[i + 2..];
    } else if s.starts_with('[') {
        return false;
    }
    let Some(colon) = s.find(':') else {
        return false;
    };
    let mut head = s[..colon].trim();
    if let Some(open) = head.find(" (") {
        if head.ends_with(')') {
            head = &head[..open];
        }
    }
    ["user", "assistant", "system", "human", "ai", "bot", "tool"]
        .iter()
        .any(|role| head.eq_ignore_ascii_case(role))
}

/// `memory` without its unfinished last line, for a memory cut at M tokens: up to its
/// last newline, or for a single line up to its last full sentence; `None` when nothing
/// finished remains.
pub fn drop_unfinished(memory: &str) -> Option<String> {
    if memory.ends_with('\n') {
        return Some(memory.to_string());
    }
    if let Some(i) = memory.rfind('\n') {
        let kept = &memory[..=i];
        return (!kept.trim().is_empty()).then(|| kept.to_string());
    }
    let end = memory
        .char_indices()
        .filter(|&(i, c)| matches!(c, '.' | '!' | '?') && memory[i + 1..].starts_with([' ', '\t']))
        .map(|(i, _)| i + 1)
        .next_back()?;
    Some(memory[..end].to_string())
}

/// What hygiene did to a step's memory.
pub fn clean(memory: &str, previous: &str, template: Template) -> (String, Option<String>) {
    if memory.trim().is_empty() {
        return (
            previous.to_string(),
            Some("the reply was empty: kept the previous memory".to_string()),
        );
    }
    if is_echo(memory, template) {
        return (
            previous.to_string(),
            Some("the reply echoed the instructions: kept the previous memory".to_string()),
        );
    }
    let mut notes: Vec<String> = Vec::new();
    let mut dropped: Vec<(&str, usize)> = Vec::new();
    let kept: Vec<&str> = memory
        .split('\n')
        .filter(|line| match degenerate(line, template) {
            None => true,
            Some(why) => {
                match dropped.iter_mut().find(|(w, _)| *w == why) {
                    Some((_, n)) => *n += 1,
                    None => dropped.push((why, 1)),
                }
                false
            }
        })
        .collect();
    let memory = if dropped.is_empty() {
        memory.to_string()
    } else {
        let kept = kept.join("\n");
        let what = dropped
            .iter()
            .map(|(why, n)| format!("{n} line{} that {why}", if *n == 1 { "" } else { "s" }))
            .collect::<Vec<_>>()
            .join(", ");
        if kept.trim().is_empty() {
            return (
                previous.to_string(),
                Some(format!(
                    "every line was degenerate ({what}): kept the previous memory"
                )),
            );
        }
        notes.push(format!("dropped {what}"));
        kept
    };
    let memory = match dedupe_lines(&memory) {
        (text, 0) => text,
        (text, n) => {
            notes.push(format!(
                "dropped {n} repeated line{}",
                if n == 1 { "" } else { "s" }
            ));
            text
        }
    };
    (memory, (!notes.is_empty()).then(|| notes.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GENERAL_UPDATE, UPDATE};

    #[test]
    fn numbered_repeats_collapse_to_one_line() {
        let looped: String = (1..=22)
            .map(|i| format!("{i}. The person's name is Ingrid.\n"))
            .collect();
        let (text, note) = clean(&looped, "No previous memory", GENERAL_UPDATE);
        assert_eq!(text, "1. The person's name is Ingrid.\n");
        assert_eq!(note.as_deref(), Some("dropped 21 repeated lines"));
    }

    #[test]
    fn a_memory_without_repeats_passes_byte_for_byte() {
        let good = "- Ada's birthday is March 3.\n\n- Ada lives in Porto.  \n1. Open task: call Bo";
        let (text, note) = clean(good, "old", UPDATE);
        assert_eq!(text, good);
        assert_eq!(note, None);
    }

    #[test]
    fn empty_and_echoed_replies_keep_the_previous_memory() {
        let (text, note) = clean("  \n ", "The code is 42.", UPDATE);
        assert_eq!(text, "The code is 42.");
        assert!(note.unwrap().contains("empty"));
        let echo = "<problem>\n</problem>\n\nUpdated memory:";
        let (text, note) = clean(echo, "The code is 42.", UPDATE);
        assert_eq!(text, "The code is 42.");
        assert!(note.unwrap().contains("echoed"));
        let (_, note) = clean(
            "Facts worth remembering, one per line:",
            "x",
            GENERAL_UPDATE,
        );
        assert!(note.unwrap().contains("echoed"));
        // A real fact among template lines is not an echo.
        assert!(!is_echo("Updated memory:\nThe code is 42.", UPDATE));
    }

    #[test]
    fn degenerate_lines_are_dropped_and_named() {
        let memory = "1. Ingrid's birthday is on March 14.\n\
2. The person who is the main character's spouse's spouse's spouse's spouse's\n\
3. User: Please remember this: your\n\
4. [2026-03-01 09:00] assistant (Ada): Sure, noted.\n\
4. 23] user (Marisol): The ferry ran late earlier on.\n\
5. The code is 1.11.1.1.1\n\
6. Updated memory:\n\
6. The previous memory contains the answer to the question \"Which number is for the Rhine?\"\n\
6. The new memory:\n\
6. The section contains a reference to a section of an article that may contain the answer.\n\
7. The budget is 1,000,000 euros.";
        let (text, note) = clean(memory, "old", UPDATE);
        assert_eq!(
            text,
            "1. Ingrid's birthday is on March 14.\n7. The budget is 1,000,000 euros."
        );
        for line in [
            "The user's neighbour is the user's neighbour.",
            "The user's neighbour is the user's neighbour's neighbour.",
            "The user's neighbour's neighbour's neighbour lives in Kyoto.",
        ] {
            assert_eq!(
                degenerate(line, GENERAL_UPDATE),
                Some("state nothing"),
                "{line}"
            );
        }
        let note = note.unwrap();
        assert!(
            note.contains("2 lines that repeat a span of words")
                && note.contains("3 lines that copy a chat turn")
                && note.contains("1 line that repeat the instructions")
                && note.contains("3 lines that speak of the memory instead of its content"),
            "{note}"
        );
    }

    #[test]
    fn a_reply_of_degenerate_lines_keeps_the_previous_memory() {
        let (text, note) = clean(
            "The person's spouse's spouse's spouse's spouse\nUser: hi",
            "Ada lives in Porto.",
            GENERAL_UPDATE,
        );
        assert_eq!(text, "Ada lives in Porto.");
        assert!(note.unwrap().contains("kept the previous memory"));
    }

    #[test]
    fn ordinary_lines_are_not_degenerate() {
        for line in [
            "The user's sister Ingrid lives in Porto.",
            "Meeting notes: the budget was approved.",
            "Bo's user name is bo_42; the password is pinecone42.",
            "Ada said \"no, no\" to the offer.",
            "The phone number is 555-1111-2222.",
            "Wait... then it rained.",
            "Version 1.1.2 ships on Monday.",
            "The user's neighbour is Ingrid.",
            "Ingrid is the user's neighbour.",
            "The plan is the plan we agreed on in May.",
            "The user decided to book the hotel for the team in May.",
            "The memorial opens in May.",
            "The new memory card holds 64 GB.",
            "The previous memory contains the names of NODVR and FZJUW.",
        ] {
            assert_eq!(degenerate(line, GENERAL_UPDATE), None, "{line}");
            assert_eq!(degenerate(line, UPDATE), None, "{line}");
        }
    }

    #[test]
    fn a_cut_memory_loses_its_unfinished_line() {
        assert_eq!(
            drop_unfinished(
                "1. Ada lives in Porto.\n2. Bo's code is 42.\n3. User: Please remember this: your"
            )
            .as_deref(),
            Some("1. Ada lives in Porto.\n2. Bo's code is 42.\n")
        );
        assert_eq!(
            drop_unfinished("Ada lives in Porto. Bo's birthday is on the 14th of Ma").as_deref(),
            Some("Ada lives in Porto.")
        );
        assert_eq!(drop_unfinished("Ada lives in Por"), None);
        assert_eq!(drop_unfinished("a\n").as_deref(), Some("a\n"));
    }

    #[test]
    fn the_line_stop_sees_a_repeated_line_as_it_completes() {
        assert_eq!(repeated_last_line("a\nb\n2. a\n"), Some(4));
        assert_eq!(repeated_last_line("a\nb\nc\n"), None);
        assert_eq!(
            repeated_last_line("a\nb\n2. a"),
            None,
            "line not complete yet"
        );
        assert_eq!(repeated_last_line("a\n"), None);
    }
}
