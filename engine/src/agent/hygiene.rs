//! Memory hygiene, whatever the model: a new memory keeps one copy of each line
//! (numbering and bullets ignored when comparing), and a memory that comes back empty or
//! as an echo of the instructions is replaced by the previous one. A memory without
//! repeated lines passes byte for byte, so a good model's output is never altered.

use super::protocol::Template;

/// The comparable form of a memory line: without list numbering or bullets, trimmed.
pub fn line_key(line: &str) -> &str {
    let mut s = line.trim();
    // "12. ", "3) ", "- ", "* ", "• "
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    if digits > 0 && s[digits..].starts_with(['.', ')', ':']) {
        s = &s[digits + 1..];
    } else if s.starts_with(['-', '*', '•']) {
        s = &s[s.chars().next().map_or(0, char::len_utf8)..];
    }
    s.trim()
}

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
    let own: std::collections::HashSet<&str> = template
        .text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.contains('{'))
        .collect();
    let mut lines = memory
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .peekable();
    lines.peek().is_some() && lines.all(|l| own.contains(l) || own.contains(line_key(l)))
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
    match dedupe_lines(memory) {
        (text, 0) => (text, None),
        (text, n) => (
            text,
            Some(format!(
                "dropped {n} repeated line{}",
                if n == 1 { "" } else { "s" }
            )),
        ),
    }
}

/// When the line just completed in `text` (it ends with a newline) repeats an earlier
/// line, the byte length to keep (up to the start of that line).
pub fn repeated_last_line(text: &str) -> Option<usize> {
    let body = text.strip_suffix('\n')?;
    let start = body.rfind('\n').map_or(0, |i| i + 1);
    let key = line_key(&body[start..]);
    if key.is_empty() || start == 0 {
        return None;
    }
    body[..start]
        .split('\n')
        .any(|l| line_key(l) == key)
        .then_some(start)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{GENERAL_UPDATE, UPDATE};

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
