//! Cutting a stream's text into passages: a few chat turns (a turn starts a new one
//! once the passage holds [`TURN_SHARE_WORDS`]), or a window of a paragraph of about
//! 60–160 words, long paragraphs in windows that overlap by [`OVERLAP_WORDS`].
//!
//! Passages close from the text before each boundary only (inside complete lines, and
//! inside a line still being written where its end cannot change them), so cutting a
//! log piece by piece as it grows gives the same passages as cutting it whole: the
//! closed passages are final; what follows the last of them (the open tail)
//! is cut provisionally, the same way as if its last line were complete, and cut again
//! from its start when more text arrives.

use memagent_engine::words::{keys, sentences, written_keys};
pub use memagent_engine::words::{lowercase_names, mentions, names};

/// A paragraph that ends (a blank line) closes its passage once it holds this many words.
pub const MIN_WORDS: usize = 60;
/// A passage closes at this many words; the next one starts [`OVERLAP_WORDS`] back.
pub const MAX_WORDS: usize = 160;
pub const OVERLAP_WORDS: usize = 32;
/// A new chat turn starts a new passage unless the current one is shorter than this: a
/// chat passage is a few turns, about as long as a paragraph's, so a turn comes with the
/// turns around it (the question it answers, the reply). Measured on LoCoMo's
/// development conversations, an evidence turn is within 5 passages for 84% of the
/// questions, against 74% at 40 words and 59% with a turn alone
/// (docs/benchmarks/conversations/).
pub const TURN_SHARE_WORDS: usize = 150;
/// Longer runs without whitespace (hashes, base64) are counted as words of this many bytes.
pub const WORD_BYTES: usize = 48;

/// A passage: bytes `[start, end)` of the text it was cut from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    pub start: usize,
    pub end: usize,
}

/// The passages of `text`: the closed (final) ones, then those of the open tail, cut
/// provisionally. `tail` is where the open tail starts (the text's end when there is
/// none): cutting again from there reproduces it and whatever follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut {
    pub closed: Vec<Span>,
    pub open: Vec<Span>,
    pub tail: usize,
}

/// Whether a line starts a chat turn as memagent renders them:
/// `[time] role (name): …` or `role: …`, role one of the OpenAI roles.
pub fn is_turn(line: &str) -> bool {
    let rest = match line.strip_prefix('[') {
        Some(r) => match r.find("] ") {
            Some(i) => &r[i + 2..],
            None => return false,
        },
        None => line,
    };
    ["user", "assistant", "system", "tool", "developer"]
        .iter()
        .any(|role| {
            rest.strip_prefix(role)
                .is_some_and(|r| r.starts_with(": ") || r.starts_with(" ("))
        })
}

/// The time of a chat turn (`[2026-11-20 09:13] user: …` gives `2026-11-20 09:13`).
pub fn turn_time(passage: &str) -> Option<&str> {
    let line = passage.trim_start();
    let rest = line.strip_prefix('[')?;
    let end = rest.find("] ")?;
    is_turn(line).then(|| &rest[..end])
}

/// The line of `text` starting the chat turn still open at its end (its last turn
/// line), or `None` when it holds no turn.
pub fn open_turn(text: &str) -> Option<&str> {
    text.lines().rev().find(|line| is_turn(line))
}

/// The speaker and the words of a chat turn rendered with a name
/// (`[2023-05-08 13:56] user (Ana): I went …` gives `("Ana", "I went …")`).
pub fn turn_speaker(line: &str) -> Option<(&str, &str)> {
    let line = line.trim_start();
    if !is_turn(line) {
        return None;
    }
    let rest = match line.strip_prefix('[') {
        Some(r) => &r[r.find("] ")? + 2..],
        None => line,
    };
    let open = rest.find(" (")?;
    let close = open + rest[open..].find("): ")?;
    Some((&rest[open + 2..close], &rest[close + 3..]))
}

/// Word spans of `line` (offsets into it): runs without whitespace, long runs in
/// pieces of at most [`WORD_BYTES`] bytes.
fn words(line: &str) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        let rest = &line[at..];
        let skip = rest.len() - rest.trim_start().len();
        let start = at + skip;
        if start >= line.len() {
            return None;
        }
        let mut end = start;
        for (i, c) in line[start..].char_indices() {
            if c.is_whitespace() || i + c.len_utf8() > WORD_BYTES {
                break;
            }
            end = start + i + c.len_utf8();
        }
        at = end;
        Some((start, end))
    })
}

/// Cuts `text` into passages (see the module documentation).
pub fn cut(text: &str) -> Cut {
    let (closed, tail) = cut_lines(text, false);
    let (mut open, rest) = cut_lines(&text[tail..], true);
    if rest < text.len() - tail {
        open.push(Span {
            start: rest,
            end: text.len() - tail,
        });
    }
    for span in &mut open {
        span.start += tail;
        span.end += tail;
    }
    Cut { closed, open, tail }
}

/// The passages closed inside complete lines (with `last_complete`, the last line
/// counts as complete), and where the unclosed rest starts.
///
/// A line still being written closes passages too, at [`MAX_WORDS`], once it is known
/// whether it starts a turn, up to its last word that is followed by more text: those
/// closings are the ones the complete line will make, so a long line without a break
/// (a log that never ends its line, a pasted document) is indexed as it grows, a window
/// at a time, instead of being read again from its start on every append.
fn cut_lines(text: &str, last_complete: bool) -> (Vec<Span>, usize) {
    let mut cutter = Cutter::default();
    let mut line_start = 0usize;
    while line_start < text.len() {
        let line_end = text[line_start..]
            .find('\n')
            .map_or(text.len(), |i| line_start + i + 1);
        let line = &text[line_start..line_end];
        if last_complete || line.ends_with('\n') {
            cutter.line(line_start, line, is_turn(line), true);
        } else {
            if let Some(turn) = starts_a_turn(line) {
                cutter.line(line_start, line, turn, false);
            }
            break;
        }
        line_start = line_end;
    }
    let Cutter { closed, start, .. } = cutter;
    // Cutting the open tail (the text taken as complete), nothing but whitespace after
    // the last passage makes no passage: the rest starts at the end. Cutting for the
    // closed passages, the tail stays where the next passage starts, whitespace and all,
    // as it does when the text is cut whole.
    let rest = if last_complete && text[start..].trim().is_empty() {
        text.len()
    } else {
        start
    };
    (closed, rest)
}

/// Passages being cut, line by line.
#[derive(Default)]
struct Cutter {
    closed: Vec<Span>,
    /// Where the passage being built starts.
    start: usize,
    /// Start offsets of its words.
    word_starts: Vec<usize>,
}

impl Cutter {
    /// Takes `line` (at `line_start`), a turn or not; an incomplete line's last word,
    /// which may still grow, is left for later.
    fn line(&mut self, line_start: usize, line: &str, turn: bool, complete: bool) {
        if line_start > self.start && self.word_starts.len() >= TURN_SHARE_WORDS && turn {
            self.closed.push(Span {
                start: self.start,
                end: line_start,
            });
            self.start = line_start;
            self.word_starts.clear();
        }
        for (ws, we) in words(line) {
            if !complete && we == line.len() {
                break;
            }
            let (ws, we) = (line_start + ws, line_start + we);
            self.word_starts.push(ws);
            if self.word_starts.len() >= MAX_WORDS {
                self.closed.push(Span {
                    start: self.start,
                    end: we,
                });
                let keep = self.word_starts.len() - OVERLAP_WORDS;
                self.word_starts.drain(..keep);
                self.start = self.word_starts[0];
            }
        }
        if complete && line.trim().is_empty() && self.word_starts.len() >= MIN_WORDS {
            self.closed.push(Span {
                start: self.start,
                end: line_start + line.len(),
            });
            self.start = line_start + line.len();
            self.word_starts.clear();
        }
    }
}

/// Whether a line still being written starts a chat turn, once its start says so
/// for good: the time's bracket closed and as many bytes after it as the longest role
/// with its separator ("assistant: "); `None` before.
fn starts_a_turn(line: &str) -> Option<bool> {
    const LONGEST_ROLE: usize = "developer (".len();
    let rest = match line.strip_prefix('[') {
        Some(r) => &r[r.find("] ")? + 2..],
        None => line,
    };
    (rest.len() >= LONGEST_ROLE).then(|| is_turn(line))
}

/// Whether `passage` shares a word (stop words aside) with `question`.
pub fn shares_words(passage: &str, question: &str) -> bool {
    let have = keys(passage);
    keys(question).iter().any(|w| have.contains(w))
}

/// Indices of the `units` sharing the most words with `question` (at least one), at
/// most `keep`, in their order. When some units hold a name the question asks about,
/// only those count: the others share words but speak of something else.
fn best_units(units: &[&str], question: &str, keep: usize) -> Vec<usize> {
    let wanted = keys(question);
    let named = lowercase_names(question);
    let names_one = |unit: &str| mentions(unit, &named);
    let any_named = units.iter().any(|u| names_one(u));
    let mut scored: Vec<(usize, usize)> = units
        .iter()
        .enumerate()
        .filter(|(_, s)| !any_named || names_one(s))
        .map(|(i, s)| {
            let have = keys(s);
            let hits = wanted.iter().filter(|w| have.contains(w)).count();
            (hits, i)
        })
        .filter(|(hits, _)| *hits > 0)
        .collect();
    scored.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut chosen: Vec<usize> = scored.iter().take(keep).map(|(_, i)| *i).collect();
    chosen.sort_unstable();
    chosen
}

/// The sentences of `passage` that share the most words with `question`, at most
/// `keep`, in their order and joined by " … "; the passage itself when no sentence
/// shares a word (it was found by meaning) or it has no more sentences than `keep`.
/// Small models answer far better from a sentence than from a paragraph.
pub fn focus(passage: &str, question: &str, keep: usize) -> String {
    let sentences = sentences(passage);
    if sentences.len() <= keep {
        return passage.trim().to_string();
    }
    let chosen = best_units(&sentences, question, keep);
    if chosen.is_empty() {
        return passage.trim().to_string();
    }
    chosen
        .iter()
        .map(|&i| sentences[i])
        .collect::<Vec<_>>()
        .join(" … ")
}

/// The turns of a chat `passage` that share the most words with `question` (at most
/// `keep`; only those naming whom the question names, when some do), each with the turn
/// before it (the question it answers, or what it goes on from: "Did you finish the
/// woodworking class?" before "Yes! A stool and two shelves"), in their order: a run of
/// adjacent turns as the passage has them, runs joined by " … ". The passage itself when
/// no turn shares a word, or every turn would be kept. A passage starting inside a turn
/// counts that part as its first turn.
pub fn focus_turns(passage: &str, question: &str, keep: usize) -> String {
    let mut turns: Vec<(usize, usize)> = Vec::new();
    let mut at = 0;
    for line in passage.split_inclusive('\n') {
        match turns.last_mut() {
            Some(last) if !is_turn(line) => last.1 = at + line.len(),
            _ => turns.push((at, at + line.len())),
        }
        at += line.len();
    }
    let texts: Vec<&str> = turns.iter().map(|&(a, b)| passage[a..b].trim()).collect();
    let chosen = best_units(&texts, question, keep);
    let mut shown: Vec<usize> = chosen
        .iter()
        .flat_map(|&i| [i.saturating_sub(1), i])
        .collect();
    shown.dedup();
    if chosen.is_empty() || shown.len() == turns.len() {
        return passage.trim().to_string();
    }
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &i in &shown {
        match runs.last_mut() {
            Some(run) if run.1 + 1 == i => run.1 = i,
            _ => runs.push((i, i)),
        }
    }
    runs.iter()
        .map(|&(first, last)| passage[turns[first].0..turns[last].1].trim())
        .collect::<Vec<_>>()
        .join(" … ")
}

/// `shown` (a chat passage as [`focus_turns`] shows it) with each turn's time left off
/// where the turn shown before it carried the same time: a sitting's turns all carry
/// its time, and "[2023-05-08 13:56] " is 18 of SmolLM2's tokens a turn.
pub fn times_once(shown: &str) -> String {
    let mut out = String::with_capacity(shown.len());
    let mut last: Option<&str> = None;
    for (i, run) in shown.split(" … ").enumerate() {
        if i > 0 {
            out.push_str(" … ");
        }
        for (j, line) in run.split('\n').enumerate() {
            if j > 0 {
                out.push('\n');
            }
            let stamp = line
                .strip_prefix('[')
                .and_then(|r| r.find("] "))
                .map(|k| &line[..k + 3])
                .filter(|_| is_turn(line));
            match stamp {
                Some(s) if last == Some(s) => out.push_str(&line[s.len()..]),
                Some(s) => {
                    last = Some(s);
                    out.push_str(line);
                }
                None => out.push_str(line),
            }
        }
    }
    out
}

/// The sentences of `passage` that share a word with `question`, in their order; the
/// whole passage when none does. A small model asked for every value gives one per
/// prompt, so a passage holding two is asked once per sentence.
///
/// A chat turn's label counts among its first sentence's words, so a question about
/// Ana asks her sentences, which tell her values in her own words ("We got a kitten"
/// for her pets). Measured on LoCoMo's development conversations
/// (docs/benchmarks/conversations/): counting only words other than the speakers'
/// names halved a list's model calls and lost values (multi-hop F1 0.251 → 0.219).
pub fn bearing_sentences<'a>(passage: &'a str, question: &str) -> Vec<&'a str> {
    let all = sentences(passage);
    let wanted = keys(question);
    let bearing: Vec<&str> = all
        .into_iter()
        .filter(|s| keys(s).iter().any(|k| wanted.contains(k)))
        .collect();
    if bearing.is_empty() {
        vec![passage.trim()]
    } else {
        bearing
    }
}

/// The words `answer` stands among in `text`: the turn of a chat passage (a sentence of
/// other text) holding the most of the answer's words, with the turn (sentence) before
/// it, speakers' labels aside; `None` when no unit holds a word of the answer. A small
/// model answers from any passage it is shown, so each passage gives an answer; what
/// stands beside it tells whether it answers the question ("aunt" beside "Porto")
/// or came from a turn about something else.
pub fn answer_context(text: &str, answer: &str) -> Option<String> {
    let units: Vec<&str> = match text.lines().any(is_turn) {
        true => text
            .lines()
            .map(|line| turn_speaker(line).map_or(line, |(_, words)| words))
            .collect(),
        false => sentences(text),
    };
    let wanted = keys(answer);
    let (i, most) = units
        .iter()
        .enumerate()
        .map(|(i, u)| (i, held(&keys(u), wanted.clone())))
        .rev()
        .max_by_key(|&(_, n)| n)?;
    if most == 0 {
        return None;
    }
    let before = if i > 0 { units[i - 1] } else { "" };
    Some(format!("{before} {}", units[i]).trim().to_string())
}

/// The byte range in `text` of the line an answer read from it cites, where `text` holds
/// chat turns: of the lines holding a word of `answer`, a turn of the one speaker the
/// question names when it names one of them (the other's turns echo what was said to
/// them: "So you ran the race!"), then the line holding most of the answer's words, then
/// most of the question's, the first of equals ("Rex is my dog." rather than "Does Rex
/// mind the noise?" for "Rex" asked the name of Ben's dog). A turn's label and time count
/// for nothing as words. `None` for text without chat turns, or when no line holds a word
/// of the answer. Measured on LoCoMo's development conversations, every 4th question
/// (docs/benchmarks/conversations/): of 188 answers citing a passage, the turn cited is
/// an evidence turn for 49% by the words alone, 51% with the speaker first (the passage
/// holds one for 68%).
pub fn answering_line(text: &str, answer: &str, question: &str) -> Option<(usize, usize)> {
    if !text.lines().any(is_turn) {
        return None;
    }
    let (wanted, asked) = (keys(answer), keys(question));
    let named = names(question);
    let is_named = |speaker: &str| {
        named
            .iter()
            .any(|n| n.trim_end_matches("'s").eq_ignore_ascii_case(speaker))
    };
    let mut speakers: Vec<&str> = text.lines().filter_map(turn_speaker).map(|t| t.0).collect();
    speakers.sort_unstable();
    speakers.dedup();
    let one_named = speakers.iter().filter(|s| is_named(s)).count() == 1;
    let mut at = 0;
    let lines: Vec<(usize, &str)> = text
        .split_inclusive('\n')
        .map(|line| {
            at += line.len();
            (at - line.len(), line)
        })
        .collect();
    lines
        .into_iter()
        .filter_map(|(from, line)| {
            let (speaker, words) = turn_speaker(line).unwrap_or(("", line));
            let words = keys(words);
            let found = held(&words, wanted.clone());
            let rank = (
                one_named && is_named(speaker),
                found,
                held(&words, asked.clone()),
            );
            let end = from + line.trim_end_matches('\n').len();
            (found > 0).then_some((rank, (from, end)))
        })
        .rev()
        .max_by_key(|&(rank, _)| rank)
        .map(|(_, range)| range)
}

/// How many of the words `question` asks about (stop words aside, by the first six
/// letters of their stems) `text` holds.
pub fn coverage(text: &str, question: &str) -> usize {
    held(&keys(text), keys(question))
}

/// [`coverage`] by the words as written ([`written_keys`]): "lives" does not count for
/// "live".
pub fn written_coverage(text: &str, question: &str) -> usize {
    held(&written_keys(text), written_keys(question))
}

fn held(have: &[String], mut wanted: Vec<String>) -> usize {
    wanted.sort_unstable();
    wanted.dedup();
    wanted.iter().filter(|k| have.contains(k)).count()
}

/// The words of `question` (stop words aside, by their first six letters) that the
/// fewest of `texts` hold, one text at least: what singles out what the question asks
/// about among texts that share its other words ("cellar" among four passages giving
/// "the access code for the …"). Empty when no text holds a word of it.
pub fn rarest_words(texts: &[&str], question: &str) -> Vec<String> {
    let held: Vec<Vec<String>> = texts.iter().map(|t| keys(t)).collect();
    let mut wanted = keys(question);
    wanted.sort_unstable();
    wanted.dedup();
    let counted: Vec<(String, usize)> = wanted
        .into_iter()
        .map(|k| {
            let n = held.iter().filter(|h| h.contains(&k)).count();
            (k, n)
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    let fewest = counted.iter().map(|(_, n)| *n).min().unwrap_or(0);
    counted
        .into_iter()
        .filter(|(_, n)| *n == fewest)
        .map(|(k, _)| k)
        .collect()
}

/// Whether `text` holds one of `words` (as [`rarest_words`] gives them).
pub fn holds_any(text: &str, words: &[String]) -> bool {
    let have = keys(text);
    words.iter().any(|w| have.contains(w))
}

/// The lines of a memory that bear on `question` (sharing the most words with it), at
/// most `keep`, in the memory's order; `None` when no line shares a word. A small
/// model answering beside passages copies whatever its notes hold, so notes about other
/// things stay out of its prompt.
pub fn relevant_notes(memory: &str, question: &str, keep: usize) -> Option<String> {
    let lines: Vec<&str> = memory
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let chosen = best_units(&lines, question, keep);
    if chosen.is_empty() {
        return None;
    }
    Some(
        chosen
            .iter()
            .map(|&i| lines[i])
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_stands_among_the_words_of_its_turn_and_the_one_before() {
        let chat = "[2023-05-08 13:56] user (Ana): Which city is your aunt from?\n\
                    [2023-05-08 13:57] user (Ravi): Porto! She moved here at twenty.\n\
                    [2023-05-08 13:58] user (Ana): We went to Rome last summer.";
        let q = "Which city is Ravi's aunt from?";
        let beside = |answer: &str| answer_context(chat, answer).map(|c| coverage(&c, q));
        // "city" and "aunt" in the question before the reply that names Porto.
        assert_eq!(
            answer_context(chat, "Porto.").as_deref(),
            Some("Which city is your aunt from? Porto! She moved here at twenty.")
        );
        assert_eq!(beside("Porto."), Some(2));
        // Rome's turn and the reply before it share none of the question's words.
        assert_eq!(beside("Rome."), Some(0));
        // An answer the passage does not hold stands nowhere.
        assert_eq!(answer_context(chat, "Norway."), None);
        // Plain text by its sentences.
        let text = "The aunt was born in Uppsala. The lake is deep. The town is old.";
        assert_eq!(
            answer_context(text, "Uppsala").as_deref(),
            Some("The aunt was born in Uppsala.")
        );
        assert_eq!(
            answer_context(text, "an old town").as_deref(),
            Some("The lake is deep. The town is old.")
        );
    }

    #[test]
    fn names_are_the_capitalised_words_inside_a_sentence() {
        assert_eq!(names("When is Ingrid's birthday?"), ["Ingrid"]);
        assert_eq!(
            names("What does my colleague Tomas do? Ask Ada and Tomas."),
            ["Tomas", "Ada"]
        );
        assert!(names("Where do I keep the wifi password?").is_empty());
        // Initials, abbreviations and titles are not names, nor do they end a sentence.
        assert_eq!(
            names("Does Ada read P. K. Varga or J.B. Okoro? Ask Dr. Ortega."),
            ["Ada", "Varga", "Okoro", "Ortega"]
        );
        assert_eq!(names("What areas of the U.S. has Ada seen?"), ["Ada"]);
        assert!(shares_words(
            "Ingrid lives in Porto.",
            "Where does Ingrid live?"
        ));
        assert!(!shares_words("The sky is blue.", "Where does Ingrid live?"));
    }

    #[test]
    fn notes_keep_the_memory_lines_about_the_question() {
        let memory = "1. Ingrid's birthday is on March 14.\n2. The user likes pasta.\n\n\
                      3. Ingrid lives in Porto.\n4. The weather was grey.";
        assert_eq!(
            relevant_notes(memory, "When is Ingrid's birthday?", 3).as_deref(),
            Some("1. Ingrid's birthday is on March 14.\n3. Ingrid lives in Porto.")
        );
        assert_eq!(
            relevant_notes(memory, "When is Ingrid's birthday?", 1).as_deref(),
            Some("1. Ingrid's birthday is on March 14.")
        );
        assert_eq!(
            relevant_notes(memory, "What is the wifi password?", 3),
            None
        );
        assert_eq!(relevant_notes("", "When is Ingrid's birthday?", 3), None);
        // Another name's line shares words but not the name.
        assert_eq!(
            focus(
                "The code for the Volga is 11. Rain fell. The code for the Tagus is 22.",
                "What is the code for the Tagus?",
                2
            ),
            "The code for the Tagus is 22."
        );
    }

    fn texts<'a>(text: &'a str, cut: &Cut) -> Vec<&'a str> {
        cut.closed
            .iter()
            .chain(cut.open.iter())
            .map(|s| &text[s.start..s.end])
            .collect()
    }

    fn words_n(n: usize, tag: &str) -> String {
        (0..n)
            .map(|i| format!("{tag}{i}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn chat_turns_are_passages_and_short_ones_share() {
        // With the four words of the first turn's time and speaker, the two short turns
        // and this one fill a passage past TURN_SHARE_WORDS, within MAX_WORDS.
        let long = words_n(TURN_SHARE_WORDS - 5, "w");
        let text = format!(
            "[2026-11-20 09:13] user (Priya): hi\nassistant: hello\nuser: {long}\nassistant: {long}\n"
        );
        let c = cut(&text);
        let t = texts(&text, &c);
        assert_eq!(t.len(), 2, "{t:?}");
        assert!(t[0].starts_with("[2026-11-20 09:13] user (Priya): hi\nassistant: hello\nuser: w0"));
        assert!(t[1].starts_with("assistant: w0"));
        assert_eq!(turn_time(t[0]), Some("2026-11-20 09:13"));
        assert_eq!(turn_time(t[1]), None);
        assert_eq!(
            turn_speaker(t[0].lines().next().unwrap()),
            Some(("Priya", "hi"))
        );
        assert_eq!(
            turn_speaker("user (Ana): I moved (again): Porto"),
            Some(("Ana", "I moved (again): Porto"))
        );
        assert_eq!(turn_speaker("assistant: hello"), None);
        assert_eq!(turn_speaker("Priya (me): hi"), None, "not a chat turn");
    }

    #[test]
    fn long_paragraphs_are_windows_that_overlap() {
        let text = format!("{}\n", words_n(400, "x"));
        let c = cut(&text);
        let t = texts(&text, &c);
        assert_eq!(c.closed.len(), 2);
        assert_eq!(t[0].split_whitespace().count(), MAX_WORDS);
        assert!(t[1].starts_with(&format!("x{} ", MAX_WORDS - OVERLAP_WORDS)));
        assert!(t.iter().all(|p| p.split_whitespace().count() <= MAX_WORDS));
    }

    #[test]
    fn paragraphs_close_at_blank_lines_once_long_enough() {
        let a = words_n(70, "a");
        let b = words_n(10, "b");
        let text = format!("{a}\n\n{b}\n\n{a}\n");
        let t = texts(&text, &cut(&text));
        assert_eq!(t.len(), 2, "{t:?}");
        assert!(t[1].starts_with("b0"), "a short paragraph joins the next");
    }

    #[test]
    fn cutting_piece_by_piece_equals_cutting_whole() {
        let mut text = String::new();
        for i in 0..40 {
            text.push_str(&format!("user: {}\n", words_n(i * 7 % 90 + 1, "t")));
            if i % 5 == 0 {
                text.push_str(&format!("\n{}\n\n", words_n(i * 13 % 300, "p")));
            }
        }
        // A long line without a break, then a turn still being written.
        text.push_str(&words_n(700, "w"));
        text.push_str(&"z".repeat(1000));
        text.push_str(&format!(
            "\n[2026-11-27 10:00] user (Ada): {}",
            words_n(400, "q")
        ));
        let whole = cut(&text);
        let shift = |spans: &[Span], by: usize| -> Vec<Span> {
            spans
                .iter()
                .map(|s| Span {
                    start: s.start + by,
                    end: s.end + by,
                })
                .collect()
        };
        for step in [1usize, 7, 61, 500] {
            let mut spans = Vec::new();
            let mut open = Vec::new();
            let mut tail = 0;
            let mut len = 0;
            while len < text.len() {
                len = (len + step).min(text.len());
                while !text.is_char_boundary(len) {
                    len += 1;
                }
                let c = cut(&text[tail..len]);
                spans.extend(shift(&c.closed, tail));
                open = shift(&c.open, tail);
                tail += c.tail;
            }
            assert_eq!(spans, whole.closed, "step {step}");
            assert_eq!(open, whole.open, "step {step}");
        }
    }

    #[test]
    fn a_line_still_being_written_closes_passages_as_it_grows() {
        for start in [
            "",
            "user: ",
            "[2026-11-27 10:00] user (Ada): ",
            "[no bracket ",
        ] {
            let text = format!("{start}{}", words_n(1000, "w"));
            let c = cut(&text);
            let closes = !start.starts_with("[no");
            assert_eq!(c.closed.len() >= 5, closes, "{start:?}: {:?}", c.closed);
            assert_eq!(c.tail > 0, closes, "{start:?}");
        }
        // The last word may still grow: no passage ends at it.
        let text = words_n(MAX_WORDS, "w");
        assert!(cut(&text).closed.is_empty());
        assert_eq!(cut(&format!("{text} ")).closed.len(), 1);
    }

    #[test]
    fn the_rarest_words_single_out_the_passage_asked_about() {
        let q = "What is the access code for the cellar?";
        let texts = [
            "The access code for the north gate is 7368886.",
            "The access code for the cellar is 4522457.",
            "The access code for the east wing is 8922960.",
        ];
        let rare = rarest_words(&texts, q);
        assert_eq!(rare, ["cellar"]);
        assert!(holds_any(texts[1], &rare) && !holds_any(texts[2], &rare));
        assert!(rarest_words(&["Fog at noon."], q).is_empty());
    }

    #[test]
    fn coverage_counts_the_question_s_words_a_text_holds() {
        let q = "What is the access code for the north gate?";
        assert_eq!(
            coverage("The access code for the north gate is 4817263.", q),
            4
        );
        assert_eq!(
            coverage("The access code for the boathouse is 5550123.", q),
            2
        );
        assert_eq!(coverage("Gates, gates: the North Gate.", q), 2);
    }

    #[test]
    fn bearing_sentences_are_those_sharing_the_question_s_words() {
        let p = "Rain all day. The hidden number for the Loire is 41. The hidden number \
                 for the Loire is 7 … Keep in mind the Loire.";
        let q = "Which hidden numbers were recorded for the Loire? List all of them.";
        assert_eq!(
            bearing_sentences(p, q),
            [
                "The hidden number for the Loire is 41.",
                "The hidden number for the Loire is 7 … Keep in mind the Loire."
            ]
        );
        assert_eq!(bearing_sentences(" Rain all day. ", q), ["Rain all day."]);
    }

    /// A chat passage is read by its turns: the one bearing on the question comes with
    /// the turn before it, which asked what the answer leaves unsaid.
    #[test]
    fn focus_turns_keeps_the_bearing_turns_with_the_turns_before_them() {
        let passage = "and the rain stopped by noon.\n\
            [2023-05-08 13:50] user (Cid): The bakery on Elm closed last week.\n\
            [2023-05-08 13:56] user (Ana): Did you finish the woodworking class, Ben?\n\
            [2023-05-08 13:57] user (Ben): Yes! A stool and two shelves,\n\
            sanded smooth.\n\
            [2023-05-08 13:58] user (Cid): The traffic was awful today.";
        let q = "What did Ben make in the woodworking class?";
        assert_eq!(
            focus_turns(passage, q, 1),
            "[2023-05-08 13:50] user (Cid): The bakery on Elm closed last week.\n\
             [2023-05-08 13:56] user (Ana): Did you finish the woodworking class, Ben?"
        );
        let shown = focus_turns(passage, q, 2);
        assert!(
            shown.contains("woodworking class, Ben?\n[2023-05-08 13:57] user (Ben): Yes! A stool"),
            "{shown}"
        );
        assert!(
            !shown.contains("traffic") && !shown.contains("rain"),
            "{shown}"
        );
        // Two bearing turns apart: two runs, each with the turn before it.
        let q = "When did the rain stop, and how was the traffic?";
        let shown = focus_turns(passage, q, 2);
        assert!(shown.starts_with("and the rain stopped"), "{shown}");
        assert!(
            shown.contains(" … [2023-05-08 13:57] user (Ben): Yes!"),
            "{shown}"
        );
        assert!(shown.ends_with("awful today."), "{shown}");
        assert!(
            !shown.contains("bakery") && !shown.contains("woodworking"),
            "{shown}"
        );
        // Nothing shared, or everything kept: the passage as it is.
        assert_eq!(focus_turns(passage, "Who won the match?", 2), passage);
        let two =
            "[2023-05-08 13:56] user (Ben): Woodworking?\n[2023-05-08 13:57] user (Ana): Yes.";
        assert_eq!(focus_turns(two, "Did Ana say yes to woodworking?", 2), two);
    }

    /// A turn's time is shown where it changes: first in the passage, after another
    /// time, across the runs " … " joins; a line that is not a turn keeps its text.
    #[test]
    fn a_time_is_shown_where_it_changes() {
        let shown = "and the rain stopped by noon.\n\
            [2023-05-08 13:56] user (Ana): Did you finish the class?\n\
            [2023-05-08 13:56] user (Ben): Yes! A stool,\n\
            [2023-05-08 13:56] sanded smooth.\n\
            [2023-05-08 13:58] user (Cid): The traffic was awful. … \
            [2023-05-08 13:58] user (Ana): Same here. … \
            [2023-06-01 09:00] user (Ben): New month.\n\
            [2023-06-01 09:00] user (Ana): Indeed.";
        assert_eq!(
            times_once(shown),
            "and the rain stopped by noon.\n\
             [2023-05-08 13:56] user (Ana): Did you finish the class?\n\
             user (Ben): Yes! A stool,\n\
             [2023-05-08 13:56] sanded smooth.\n\
             [2023-05-08 13:58] user (Cid): The traffic was awful. … \
             user (Ana): Same here. … \
             [2023-06-01 09:00] user (Ben): New month.\n\
             user (Ana): Indeed."
        );
        let plain = "[2023-05-08 13:56] Notes.\n[2023-05-08 13:56] More notes.";
        assert_eq!(times_once(plain), plain);
    }

    #[test]
    fn focus_keeps_the_sentences_that_share_the_question_s_words() {
        let p = "[2026-01-05 10:00] user: We went to the market. My sister Ingrid's birthday \
                 is on the 14th of March. The weather was grey.\nassistant: Noted.";
        assert_eq!(
            focus(p, "When is Ingrid's birthday?", 2),
            "My sister Ingrid's birthday is on the 14th of March."
        );
        // Found by meaning, not by words: the passage as it is.
        assert_eq!(focus(p, "sibling party date", 2), p);
        assert_eq!(focus("One. Two.", "two", 2), "One. Two.");
    }

    #[test]
    fn huge_words_and_empty_text_are_bounded() {
        assert_eq!(
            cut(""),
            Cut {
                closed: vec![],
                open: vec![],
                tail: 0
            }
        );
        assert!(cut("\n\n  \n").open.is_empty());
        // A megabyte without a newline: passages close as it is written (but at its last
        // word, which may grow), the rest provisional.
        let text = "é".repeat(500_000);
        let c = cut(&text);
        assert!(c.closed.len() > 100);
        assert!(!c.open.is_empty());
        let all = c.closed.iter().chain(c.open.iter());
        assert!(all
            .clone()
            .all(|s| s.end - s.start <= MAX_WORDS * WORD_BYTES + MAX_WORDS));
        assert_eq!(all.last().map(|s| s.end), Some(text.len()));
    }

    #[test]
    fn an_answer_cites_the_line_holding_its_words_then_the_question_s() {
        let text = "[2024-03-09 18:08] user (Ana): Does Rex mind the noise?\n\
                    [2024-03-09 18:09] user (Ben): Rex is my dog and he sleeps through it.\n\
                    [2024-03-09 18:10] user (Ana): Good night, Ben.\n";
        let (at, end) = answering_line(text, "Rex.", "What is the name of Ben's dog?").unwrap();
        assert_eq!(
            &text[at..end],
            "[2024-03-09 18:09] user (Ben): Rex is my dog and he sleeps through it."
        );
        // A label counts for nothing: "Ben" is said only in the last turn.
        let (at, _) = answering_line(text, "Ben", "Who said good night?").unwrap();
        assert!(text[at..].starts_with("[2024-03-09 18:10]"));
        assert_eq!(answering_line(text, "Porto.", "Where?"), None);
        // The speaker the question names before the one echoing the answer to them.
        let text = "[2024-03-09 18:08] user (Ana): I ran my first half marathon on Sunday.\n\
                    [2024-03-09 18:09] user (Ben): A half marathon, Ana! How long did it take?\n";
        let (at, _) = answering_line(text, "A half marathon.", "What race did Ana run?").unwrap();
        assert!(text[at..].starts_with("[2024-03-09 18:08] user (Ana)"));
        let (at, _) = answering_line(text, "A half marathon.", "What did Ben ask about?").unwrap();
        assert!(text[at..].starts_with("[2024-03-09 18:09] user (Ben)"));
        assert_eq!(answering_line("Rex is a dog.\n", "Rex.", "Who?"), None);
    }
}
