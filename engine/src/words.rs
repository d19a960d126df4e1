//! Words of questions and texts as the loop and recall compare them: sentences, word
//! keys (stop words aside, stemmed, first six letters) and the names a question asks about.

/// Words too common to tell sentences apart.
const STOP_WORDS: &[&str] = &[
    "a",
    "an",
    "the",
    "is",
    "are",
    "was",
    "were",
    "be",
    "been",
    "am",
    "do",
    "does",
    "did",
    "of",
    "to",
    "in",
    "on",
    "at",
    "for",
    "by",
    "with",
    "and",
    "or",
    "but",
    "if",
    "it",
    "its",
    "this",
    "that",
    "these",
    "those",
    "what",
    "which",
    "who",
    "whom",
    "whose",
    "when",
    "where",
    "why",
    "how",
    "i",
    "me",
    "my",
    "you",
    "your",
    "we",
    "our",
    "he",
    "she",
    "his",
    "her",
    "they",
    "their",
    "them",
    "there",
    "here",
    "as",
    "from",
    "about",
    "can",
    "could",
    "would",
    "should",
    "will",
    "shall",
    "have",
    "has",
    "had",
    "not",
    "no",
    "so",
    "than",
    "then",
    "any",
    "all",
    "user",
    "assistant",
    "s",
];

/// Whether `word` (lower case) is too common to tell sentences apart.
pub fn is_stop_word(word: &str) -> bool {
    STOP_WORDS.contains(&word)
}

/// The words of `text` as written, for matching: lower case, their first six
/// characters ("birthday" meets "birthdays", "lives" does not meet "live"), stop words
/// dropped.
pub fn written_keys(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .filter(|w| !STOP_WORDS.contains(&w.as_str()))
        .map(|w| w.chars().take(6).collect())
        .collect()
}

/// A word's key for matching: lower case, Porter-stemmed, its first six characters (so
/// that "camps" meets "camp", "started" meets "start" and "birthday" meets
/// "birthdays"), stop words dropped.
pub fn keys(text: &str) -> Vec<String> {
    let stemmer = frostem::Stemmer::new(frostem::Algorithm::Porter);
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .filter(|w| !STOP_WORDS.contains(&w.as_str()))
        .map(|w| stemmer.stem(&w).chars().take(6).collect())
        .collect()
}

/// Every word of `text`, lower case and Porter-stemmed, stop words kept, a possessive
/// `'s` dropped: what a sentence says in its own words, for telling whether an answer
/// repeats the question.
pub fn stems(text: &str) -> Vec<String> {
    let stemmer = frostem::Stemmer::new(frostem::Algorithm::Porter);
    text.split(|c: char| !c.is_alphanumeric() && c != '\'' && c != '\u{2019}')
        .map(|w| w.to_lowercase().replace('\u{2019}', "'"))
        .map(|w| {
            let w = w.trim_matches('\'');
            w.strip_suffix("'s").unwrap_or(w).to_string()
        })
        .filter(|w| !w.is_empty())
        .map(|w| stemmer.stem(&w).into_owned())
        .collect()
}

/// Titles written short with a period ("Dr. Ortega"): their period does not end a
/// sentence and they are not names.
const TITLES: &[&str] = &["Dr", "Mr", "Mrs", "Ms", "Mt", "St", "Jr", "Sr"];

/// Whether `word` (as written, punctuation and all) is an initial, an abbreviation
/// spelled with periods or a short title: "P.", "J.B.", "U.S.", "Dr.".
fn abbreviation(word: &str) -> bool {
    let word = word.trim_start_matches(|c: char| !c.is_alphanumeric());
    let word = word.trim_end_matches([',', ';', ':', '?', '!', ')', '"', '\'']);
    let Some(short) = word.strip_suffix('.') else {
        return false;
    };
    let parts: Vec<&str> = short.split('.').collect();
    let letters = |p: &&str| !p.is_empty() && p.chars().all(char::is_alphabetic);
    parts.iter().all(letters)
        && match parts.as_slice() {
            [one] => one.chars().count() == 1 || TITLES.contains(one),
            _ => parts.iter().all(|p| p.chars().count() <= 2),
        }
}

/// The names in `question`: capitalised words that do not start a sentence (`I` aside),
/// without a possessive `'s`. Initials, abbreviations and titles ("P. K. Varga",
/// "the U.S.", "Dr. Ortega") are not names and their periods end no sentence, so the
/// name they stand before is one ("Varga", "Ortega").
pub fn names(question: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut starts = true;
    for word in question.split_whitespace() {
        if abbreviation(word) {
            continue;
        }
        let bare = word.trim_matches(|c: char| !c.is_alphanumeric());
        let bare = bare
            .strip_suffix("'s")
            .or_else(|| bare.strip_suffix("\u{2019}s"))
            .unwrap_or(bare);
        let capital = bare.chars().next().is_some_and(char::is_uppercase);
        if !starts && capital && bare != "I" && !out.iter().any(|n| n == bare) {
            out.push(bare.to_string());
        }
        starts = word.ends_with(['.', '?', '!', ':']);
    }
    out
}

/// The sentences of `text`: each line cut after `.`, `?` or `!` that follows a letter,
/// a digit or a closing quote or bracket and precedes a space (so "3.5" stays whole);
/// empty ones dropped.
pub fn sentences(text: &str) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for line in text.lines() {
        let bytes = line.as_bytes();
        let mut from = 0;
        for (i, c) in line.char_indices() {
            let ends = matches!(c, '.' | '?' | '!')
                && bytes.get(i + 1) == Some(&b' ')
                && line[..i]
                    .chars()
                    .last()
                    .is_some_and(|c| c.is_alphanumeric() || matches!(c, ')' | '"' | '\''));
            if ends {
                out.push(line[from..=i].trim());
                from = i + 1;
            }
        }
        out.push(line[from..].trim());
    }
    out.retain(|s| !s.is_empty());
    out
}

/// The question's [`names`], lower case, for [`mentions`].
pub fn lowercase_names(question: &str) -> Vec<String> {
    names(question).iter().map(|n| n.to_lowercase()).collect()
}

/// Whether `text` holds one of `names` (lower case), ignoring case.
pub fn mentions(text: &str, names: &[String]) -> bool {
    let text = text.to_lowercase();
    names.iter().any(|n| text.contains(n.as_str()))
}

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

    #[test]
    fn keys_meet_other_forms_of_a_word() {
        let turn = keys("I just started going to boot camps with my family");
        for word in ["start", "camp", "families", "booted"] {
            let key = keys(word);
            assert!(turn.contains(&key[0]), "{word} → {key:?} not in {turn:?}");
        }
        assert!(keys("the and of what").is_empty(), "stop words are dropped");
        assert_ne!(keys("camp"), keys("campaign"));
        assert_eq!(written_keys("Ravi lives there"), ["ravi", "lives"]);
    }
}
