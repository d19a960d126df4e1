//! RULER-style tasks, generated deterministically from a seed at a length measured in
//! model tokens: needles (single, multi-key, multi-value, multi-query), variable tracking,
//! common- and frequent-word extraction, and question answering over supplied paragraphs.

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::haystack::Haystack;
use crate::error::{Error, Result};
use crate::split::EvalSplit;
use memagent_agent::TextTokenizer;

/// Keys of the needles.
pub const CITIES: &[&str] = &[
    "Zurich",
    "Lisbon",
    "Nairobi",
    "Osaka",
    "Montreal",
    "Valparaiso",
    "Tbilisi",
    "Reykjavik",
    "Hanoi",
    "Marrakesh",
    "Krakow",
    "Auckland",
    "Cartagena",
    "Tallinn",
    "Brisbane",
    "Dakar",
    "Seville",
    "Winnipeg",
    "Bergen",
    "Cusco",
    "Porto",
    "Ljubljana",
    "Kyoto",
    "Havana",
    "Sapporo",
    "Adelaide",
    "Antwerp",
    "Bordeaux",
    "Gdansk",
    "Halifax",
    "Mombasa",
    "Salzburg",
];

/// The task families.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Task {
    /// One needle; its value a 7-digit number.
    NiahSingle,
    /// One needle; its value a word.
    NiahSingleWord,
    /// One needle; its value a UUID.
    NiahSingleUuid,
    /// The asked needle among distractor needles with other keys.
    NiahMultikey,
    /// Every value of one key (four needles).
    NiahMultivalue,
    /// The values of four keys asked at once.
    NiahMultiquery,
    /// Variable tracking: every variable a chain of assignments gives one value.
    Vt,
    /// The ten most common words of a numbered list.
    Cwe,
    /// The three most frequent words of a Zipf-distributed coded text.
    Fwe,
    /// Question answering over gold and distractor paragraphs (`--qa FILE`).
    Qa,
}

pub const ALL_TASKS: &[Task] = &[
    Task::NiahSingle,
    Task::NiahSingleWord,
    Task::NiahSingleUuid,
    Task::NiahMultikey,
    Task::NiahMultivalue,
    Task::NiahMultiquery,
    Task::Vt,
    Task::Cwe,
    Task::Fwe,
    Task::Qa,
];

impl Task {
    pub fn name(self) -> &'static str {
        match self {
            Self::NiahSingle => "niah_single",
            Self::NiahSingleWord => "niah_single_word",
            Self::NiahSingleUuid => "niah_single_uuid",
            Self::NiahMultikey => "niah_multikey",
            Self::NiahMultivalue => "niah_multivalue",
            Self::NiahMultiquery => "niah_multiquery",
            Self::Vt => "vt",
            Self::Cwe => "cwe",
            Self::Fwe => "fwe",
            Self::Qa => "qa",
        }
    }

    /// How answers are scored.
    pub fn scoring(self) -> Scoring {
        match self {
            Self::Qa => Scoring::SubEm,
            _ => Scoring::RecallAll,
        }
    }
}

impl fmt::Display for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Task {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        ALL_TASKS
            .iter()
            .copied()
            .find(|t| t.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = ALL_TASKS.iter().map(|t| t.name()).collect();
                Error::InvalidRequest(format!("unknown task `{s}`; tasks: {}", names.join(", ")))
            })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scoring {
    /// The fraction of expected values the answer holds (RULER's string_match_all).
    RecallAll,
    /// MemAgent's sub_em on normalised text, with F1 and exact match beside it.
    SubEm,
}

/// One generated sample.
#[derive(Debug, Clone, Serialize)]
pub struct RulerSample {
    pub task: Task,
    pub seed: u64,
    #[serde(skip)]
    pub document: String,
    pub question: String,
    /// Values the answer must hold (all of them), or the gold answers of a QA sample.
    pub expected: Vec<String>,
    /// Inserted sentences (needles, assignments) with their byte offsets and the depth
    /// (token fraction) where they landed.
    pub inserts: Vec<Insert>,
    /// Tokens of the document.
    pub tokens: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Insert {
    pub text: String,
    pub byte: usize,
    /// Tokens of filler before it.
    pub token: usize,
    pub depth: f64,
}

/// One QA item (`--qa FILE`, JSON Lines).
#[derive(Debug, Clone, Deserialize)]
pub struct QaItem {
    pub question: String,
    pub answers: Vec<String>,
    /// Paragraphs that hold the answer.
    #[serde(default)]
    pub gold: Vec<String>,
    /// Paragraphs that do not.
    #[serde(default)]
    pub distractors: Vec<String>,
}

/// What a task is generated from.
pub struct Sources<'a> {
    pub haystack: &'a Haystack,
    pub tokenizer: &'a dyn TextTokenizer,
    /// QA items; sample `seed` uses item `seed % len`, and the other items' paragraphs
    /// pad the document.
    pub qa: &'a [QaItem],
}

/// The sentence forms and keys of one split of the generated tasks.
struct Forms {
    keys: &'static [&'static str],
    /// `{kind}`, `{key}`, `{value}`.
    needle: &'static str,
    question: &'static str,
    /// `{key}`; then `{keys}` (four keys joined).
    all_values: &'static str,
    all_keys: &'static str,
    /// `{name}`, `{value}`; then `{name}` and `{from}`; then `{value}`.
    assign: &'static str,
    assign_var: &'static str,
    variables: &'static str,
}

/// RULER's own forms: the benchmark (`test`) split.
const TEST_FORMS: Forms = Forms {
    keys: CITIES,
    needle: "One of the special magic {kind} for {key} is: {value}.",
    question: "What is the special magic {kind} for {key} mentioned in the provided text?",
    all_values: "What are all the special magic numbers for {key} mentioned in the provided text?",
    all_keys: "What are all the special magic numbers for {keys} mentioned in the provided text?",
    assign: "VAR {name} = {value}.",
    assign_var: "VAR {name} = VAR {from}.",
    variables: "Find all variables that are assigned the value {value} in the text above.",
};

/// Forms no benchmark uses: settings and prompts are chosen on this split.
const VALIDATION_FORMS: Forms = Forms {
    keys: &[
        "the Danube",
        "the Mekong",
        "the Volga",
        "the Zambezi",
        "the Orinoco",
        "the Yukon",
        "the Rhine",
        "the Ganges",
        "the Loire",
        "the Murray",
        "the Tagus",
        "the Indus",
    ],
    needle: "Keep in mind that the hidden {kind} recorded for {key} is {value}.",
    question: "Which hidden {kind} was recorded for {key} in the text?",
    all_values: "Which hidden numbers were recorded for {key} in the text? List all of them.",
    all_keys: "Which hidden numbers were recorded for {keys} in the text? List all of them.",
    assign: "Let {name} hold {value}.",
    assign_var: "Let {name} hold whatever {from} holds.",
    variables: "Which names end up holding {value} in the text above? List all of them.",
};

fn fill(form: &str, pairs: &[(&str, &str)]) -> String {
    pairs.iter().fold(form.to_string(), |s, (k, v)| {
        s.replace(&format!("{{{k}}}"), v)
    })
}

/// Generates `task` at about `tokens` tokens from `seed`, in RULER's own forms (the
/// benchmark split; [`generate_split`] draws the validation split).
pub fn generate(
    sources: &Sources<'_>,
    task: Task,
    tokens: usize,
    seed: u64,
) -> Result<RulerSample> {
    generate_split(sources, task, tokens, seed, EvalSplit::Test)
}

/// Generates `task` at about `tokens` tokens from `seed` in `split`: the validation split
/// has its own keys, sentence forms and seeds (pair it with its own filler,
/// [`crate::training::validation_filler`]).
pub fn generate_split(
    sources: &Sources<'_>,
    task: Task,
    tokens: usize,
    seed: u64,
    split: EvalSplit,
) -> Result<RulerSample> {
    let (forms, salt) = match split {
        EvalSplit::Test => (&TEST_FORMS, 0),
        EvalSplit::Validation => (&VALIDATION_FORMS, 0x7A11_DA7E_u64 << 24),
    };
    let mut rng =
        StdRng::seed_from_u64(seed ^ salt ^ (task as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut keys: Vec<&str> = forms.keys.to_vec();
    keys.shuffle(&mut rng);
    let number = |rng: &mut StdRng| rng.random_range(1_000_000u32..10_000_000).to_string();
    let needle = |kind: &str, key: &str, value: &str| {
        fill(
            forms.needle,
            &[("kind", kind), ("key", key), ("value", value)],
        )
    };
    let question_of = |kind: &str, key: &str| fill(forms.question, &[("kind", kind), ("key", key)]);
    let (inserts, question, expected): (Vec<String>, String, Vec<String>) = match task {
        Task::NiahSingle | Task::NiahSingleWord | Task::NiahSingleUuid => {
            let (kind, value) = match task {
                Task::NiahSingle => ("number", number(&mut rng)),
                Task::NiahSingleWord => ("word", pseudo_word(&mut rng, 3)),
                _ => ("uuid", uuid(&mut rng)),
            };
            (
                vec![needle(kind, keys[0], &value)],
                question_of(kind, keys[0]),
                vec![value],
            )
        }
        Task::NiahMultikey => {
            let values: Vec<String> = (0..4).map(|_| number(&mut rng)).collect();
            (
                (0..4)
                    .map(|i| needle("numbers", keys[i], &values[i]))
                    .collect(),
                question_of("number", keys[0]),
                vec![values[0].clone()],
            )
        }
        Task::NiahMultivalue => {
            let values = distinct(&mut rng, 4, number);
            (
                values
                    .iter()
                    .map(|v| needle("numbers", keys[0], v))
                    .collect(),
                fill(forms.all_values, &[("key", keys[0])]),
                values,
            )
        }
        Task::NiahMultiquery => {
            let values: Vec<String> = (0..4).map(|_| number(&mut rng)).collect();
            (
                (0..4)
                    .map(|i| needle("numbers", keys[i], &values[i]))
                    .collect(),
                fill(
                    forms.all_keys,
                    &[(
                        "keys",
                        &format!("{}, {}, {} and {}", keys[0], keys[1], keys[2], keys[3]),
                    )],
                ),
                values,
            )
        }
        Task::Vt => {
            let names = distinct(&mut rng, 5, |rng| {
                (0..5)
                    .map(|_| rng.random_range(b'A'..=b'Z') as char)
                    .collect()
            });
            let value = rng.random_range(10_000u32..100_000).to_string();
            let mut chain = vec![fill(
                forms.assign,
                &[("name", &names[0]), ("value", &value)],
            )];
            for pair in names.windows(2) {
                chain.push(fill(
                    forms.assign_var,
                    &[("name", &pair[1]), ("from", &pair[0])],
                ));
            }
            (chain, fill(forms.variables, &[("value", &value)]), names)
        }
        Task::Cwe => return common_words(sources.tokenizer, task, tokens, seed, &mut rng),
        Task::Fwe => return frequent_words(sources.tokenizer, task, tokens, seed, &mut rng),
        Task::Qa => return qa(sources, task, tokens, seed, &mut rng),
    };
    // Depths: random, in order for a chain (its assignments must be read in order).
    let mut depths: Vec<f64> = (0..inserts.len())
        .map(|_| rng.random_range(0.0..1.0))
        .collect();
    if task == Task::Vt {
        depths.sort_by(f64::total_cmp);
    }
    let start = rng.random_range(0..sources.haystack.word_count());
    let placed: Vec<(f64, String)> = depths.into_iter().zip(inserts).collect();
    let (document, inserts) = compose(sources.haystack, sources.tokenizer, tokens, start, &placed)?;
    let tokens = sources.tokenizer.encode(&document)?.len();
    Ok(RulerSample {
        task,
        seed,
        document,
        question,
        expected,
        inserts,
        tokens,
    })
}

/// `n` distinct values from `make`.
fn distinct(rng: &mut StdRng, n: usize, make: impl Fn(&mut StdRng) -> String) -> Vec<String> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    while out.len() < n {
        let v = make(rng);
        if seen.insert(v.clone()) {
            out.push(v);
        }
    }
    out
}

/// A pronounceable lower-case word of `syllables` consonant-vowel pairs.
fn pseudo_word(rng: &mut StdRng, syllables: usize) -> String {
    const C: &[u8] = b"bdfgklmnprstvz";
    const V: &[u8] = b"aeiou";
    (0..syllables)
        .flat_map(|_| {
            [
                C[rng.random_range(0..C.len())] as char,
                V[rng.random_range(0..V.len())] as char,
            ]
        })
        .collect()
}

fn uuid(rng: &mut StdRng) -> String {
    let b: [u8; 16] = rng.random();
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// Filler of about `tokens` tokens in total with each sentence inserted at its depth
/// (snapped to the next sentence end of the filler).
pub fn compose(
    haystack: &Haystack,
    tokenizer: &dyn TextTokenizer,
    tokens: usize,
    start: usize,
    inserts: &[(f64, String)],
) -> Result<(String, Vec<Insert>)> {
    let mut insert_tokens = 0;
    for (depth, text) in inserts {
        if !(0.0..=1.0).contains(depth) {
            return Err(Error::InvalidRequest(format!(
                "depth {depth} is outside 0..1"
            )));
        }
        insert_tokens += tokenizer.encode(&format!(" {text}"))?.len();
    }
    let filler = haystack.take(tokenizer, start, tokens.saturating_sub(insert_tokens))?;
    let filler_tokens: usize = filler.iter().map(|(_, n)| n).sum();
    // Word index of each insert: the first word boundary at its depth, on to a sentence
    // end (within 64 words).
    let mut order: Vec<usize> = (0..inserts.len()).collect();
    order.sort_by(|&a, &b| inserts[a].0.total_cmp(&inserts[b].0));
    let mut at_word = vec![0; inserts.len()];
    for &i in &order {
        let target = (filler_tokens as f64 * inserts[i].0).round() as usize;
        let (mut at, mut before) = (0, 0);
        while at < filler.len() && before < target {
            before += filler[at].1;
            at += 1;
        }
        let limit = (at + 64).min(filler.len());
        while at > 0 && at < limit && !filler[at - 1].0.ends_with(['.', '!', '?']) {
            at += 1;
        }
        at_word[i] = at;
    }
    let mut document = String::new();
    let mut placed = vec![None; inserts.len()];
    let mut token_at = vec![0usize; inserts.len()];
    let mut tokens_so_far = 0;
    let mut next = 0;
    for w in 0..=filler.len() {
        while next < order.len() && at_word[order[next]] == w {
            let i = order[next];
            if !document.is_empty() {
                document.push(' ');
            }
            placed[i] = Some(document.len());
            token_at[i] = tokens_so_far;
            document.push_str(&inserts[i].1);
            next += 1;
        }
        if let Some((word, n)) = filler.get(w) {
            if !document.is_empty() {
                document.push(' ');
            }
            document.push_str(word);
            tokens_so_far += n;
        }
    }
    let total = filler_tokens.max(1) as f64;
    let out = inserts
        .iter()
        .enumerate()
        .map(|(i, (_, text))| Insert {
            text: text.clone(),
            byte: placed[i].expect("every insert is placed"),
            token: token_at[i],
            depth: token_at[i] as f64 / total,
        })
        .collect();
    Ok((document, out))
}

/// Builds a text from a size (items or words) so that it comes within 1% of `tokens`:
/// the size is scaled by the tokens the last attempt measured. `build(size)` must be
/// deterministic.
fn sized(
    tokenizer: &dyn TextTokenizer,
    tokens: usize,
    first: usize,
    build: impl Fn(usize) -> String,
) -> Result<(String, usize)> {
    let mut size = first.max(1);
    let mut best: Option<(String, usize)> = None;
    for _ in 0..8 {
        let text = build(size);
        let n = tokenizer.encode(&text)?.len();
        let off = (n as f64 - tokens as f64).abs() / tokens as f64;
        if best
            .as_ref()
            .is_none_or(|(_, b)| (*b as f64 - tokens as f64).abs() / tokens as f64 > off)
        {
            best = Some((text, n));
        }
        if off < 0.01 {
            break;
        }
        size = ((size as f64 * tokens as f64 / n.max(1) as f64).round() as usize).max(1);
    }
    Ok(best.expect("at least one attempt"))
}

fn common_words(
    tokenizer: &dyn TextTokenizer,
    task: Task,
    tokens: usize,
    seed: u64,
    rng: &mut StdRng,
) -> Result<RulerSample> {
    // Ten common words, each at least twice as frequent as any other (those appear three
    // times each); items are numbered, one per line.
    let vocabulary = distinct(rng, 10 + tokens / 6 + 16, |rng| pseudo_word(rng, 3));
    let (common, rare) = vocabulary.split_at(10);
    let order_seed: u64 = rng.random();
    let build = |items: usize| {
        let common_count = (items / 40).max(6);
        let mut words: Vec<&str> = Vec::new();
        for w in common {
            words.extend(std::iter::repeat_n(w.as_str(), common_count));
        }
        let mut r = 0;
        while words.len() < items {
            words.extend(std::iter::repeat_n(rare[r % rare.len()].as_str(), 3));
            r += 1;
        }
        words.shuffle(&mut StdRng::seed_from_u64(order_seed));
        words
            .iter()
            .enumerate()
            .map(|(i, w)| format!("{}. {w}\n", i + 1))
            .collect::<String>()
    };
    let (document, tokens) = sized(tokenizer, tokens, tokens / 6, build)?;
    Ok(RulerSample {
        task,
        seed,
        document,
        question: "What are the 10 most common words in the above list?".into(),
        expected: common.to_vec(),
        inserts: Vec::new(),
        tokens,
    })
}

fn frequent_words(
    tokenizer: &dyn TextTokenizer,
    task: Task,
    tokens: usize,
    seed: u64,
    rng: &mut StdRng,
) -> Result<RulerSample> {
    // Zipf with exponent 2 over a vocabulary of coded words, as RULER's fwe.
    let vocabulary = distinct(rng, 60, |rng| pseudo_word(rng, 2) + &pseudo_word(rng, 1));
    let weights: Vec<f64> = (1..=vocabulary.len())
        .map(|r| 1.0 / (r * r) as f64)
        .collect();
    let sum: f64 = weights.iter().sum();
    let order_seed: u64 = rng.random();
    let build = |size: usize| {
        let mut words = Vec::new();
        for (word, w) in vocabulary.iter().zip(&weights) {
            let n = ((w / sum) * size as f64).round().max(1.0) as usize;
            words.extend(std::iter::repeat_n(word.as_str(), n));
        }
        words.shuffle(&mut StdRng::seed_from_u64(order_seed));
        words.join(" ")
    };
    let (document, tokens) = sized(tokenizer, tokens, tokens / 3, build)?;
    Ok(RulerSample {
        task,
        seed,
        document,
        question: "What are the three most frequently appeared coded words in the above coded \
                   text?"
            .into(),
        expected: vocabulary[..3].to_vec(),
        inserts: Vec::new(),
        tokens,
    })
}

fn qa(
    sources: &Sources<'_>,
    task: Task,
    tokens: usize,
    seed: u64,
    rng: &mut StdRng,
) -> Result<RulerSample> {
    if sources.qa.is_empty() {
        return Err(Error::InvalidRequest(
            "the qa task needs questions: pass --qa FILE (JSON Lines of question, answers, \
             gold, distractors)"
                .into(),
        ));
    }
    let item = &sources.qa[seed as usize % sources.qa.len()];
    // The item's own paragraphs, then other items' paragraphs as further distractors.
    let mut pool: Vec<&str> = item.distractors.iter().map(String::as_str).collect();
    let mut others: Vec<&str> = sources
        .qa
        .iter()
        .filter(|q| !std::ptr::eq(*q, item))
        .flat_map(|q| q.gold.iter().chain(&q.distractors).map(String::as_str))
        .filter(|p| !item.gold.iter().any(|g| g == p))
        .collect();
    others.shuffle(rng);
    pool.extend(others);
    let overhead = sources.tokenizer.encode("Document 10:\n\n\n")?.len();
    let mut chosen: Vec<String> = item.gold.clone();
    let mut total: usize = chosen
        .iter()
        .map(|p| sources.tokenizer.encode(p).map(|t| t.len() + overhead))
        .sum::<Result<usize, memagent_agent::Error>>()?;
    for p in pool {
        let n = sources.tokenizer.encode(p)?.len() + overhead;
        if total + n <= tokens {
            total += n;
            chosen.push(p.to_string());
        }
    }
    chosen.shuffle(rng);
    let render = |docs: &[String]| -> String {
        docs.iter()
            .enumerate()
            .map(|(i, p)| format!("Document {}:\n{p}\n\n", i + 1))
            .collect()
    };
    // Out of paragraphs: pad with haystack passages, as further distractors.
    let mut start = rng.random_range(0..sources.haystack.word_count());
    let mut document = render(&chosen);
    let mut n = sources.tokenizer.encode(&document)?.len();
    // Paragraphs counted one by one come out a little short of the joined text: drop
    // distractors from the end until it fits.
    while n > tokens {
        let Some(last) = chosen.iter().rposition(|p| !item.gold.contains(p)) else {
            break;
        };
        chosen.remove(last);
        document = render(&chosen);
        n = sources.tokenizer.encode(&document)?.len();
    }
    for _ in 0..64 {
        if n + overhead + 4 > tokens || (tokens - n) as f64 / (tokens as f64) < 0.01 {
            break;
        }
        let want = (tokens - n - overhead).min(256);
        let words = sources.haystack.take(sources.tokenizer, start, want)?;
        start += words.len();
        chosen.push(words.iter().map(|(w, _)| *w).collect::<Vec<_>>().join(" "));
        document = render(&chosen);
        n = sources.tokenizer.encode(&document)?.len();
    }
    let tokens = n;
    Ok(RulerSample {
        task,
        seed,
        document,
        question: item.question.clone(),
        expected: item.answers.clone(),
        inserts: Vec::new(),
        tokens,
    })
}

/// Lower case, punctuation and the articles a/an/the dropped, spaces squeezed.
pub fn normalize(text: &str) -> String {
    let lowered: String = text
        .to_lowercase()
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || c.is_whitespace() {
                c
            } else {
                ' '
            }
        })
        .collect();
    lowered
        .split_whitespace()
        .filter(|w| !matches!(*w, "a" | "an" | "the"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The fraction of `expected` values that `answer` holds (case-insensitive).
pub fn recall_all(answer: &str, expected: &[String]) -> f64 {
    if expected.is_empty() {
        return 0.0;
    }
    let answer = answer.to_lowercase();
    let found = expected
        .iter()
        .filter(|e| answer.contains(&e.to_lowercase()))
        .count();
    found as f64 / expected.len() as f64
}

/// MemAgent's sub_em: 1 when the normalised prediction contains a normalised gold answer
/// or is contained in it; an empty prediction contains nothing.
pub fn sub_em(prediction: &str, golds: &[String]) -> f64 {
    let p = normalize(prediction);
    if p.is_empty() {
        return 0.0;
    }
    let hit = golds.iter().any(|g| {
        let g = normalize(g);
        !g.is_empty() && (p.contains(&g) || g.contains(&p))
    });
    f64::from(u8::from(hit))
}

pub fn exact_match(prediction: &str, golds: &[String]) -> f64 {
    let p = normalize(prediction);
    f64::from(u8::from(golds.iter().any(|g| normalize(g) == p)))
}

/// Token-level F1 against the best gold answer.
pub fn f1(prediction: &str, golds: &[String]) -> f64 {
    let p = normalize(prediction);
    let p: Vec<&str> = p.split_whitespace().collect();
    golds
        .iter()
        .map(|g| {
            let g = normalize(g);
            let g: Vec<&str> = g.split_whitespace().collect();
            if p.is_empty() || g.is_empty() {
                return 0.0;
            }
            let mut remaining = g.clone();
            let mut common = 0;
            for w in &p {
                if let Some(i) = remaining.iter().position(|x| x == w) {
                    remaining.swap_remove(i);
                    common += 1;
                }
            }
            if common == 0 {
                return 0.0;
            }
            let precision = common as f64 / p.len() as f64;
            let recall = common as f64 / g.len() as f64;
            2.0 * precision * recall / (precision + recall)
        })
        .fold(0.0, f64::max)
}

/// A sample's score (0 to 1) with F1 and exact match for QA.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Score {
    pub score: f64,
    pub f1: Option<f64>,
    pub exact: Option<f64>,
}

pub fn score(task: Task, answer: &str, expected: &[String]) -> Score {
    match task.scoring() {
        Scoring::RecallAll => Score {
            score: recall_all(answer, expected),
            f1: None,
            exact: None,
        },
        Scoring::SubEm => Score {
            score: sub_em(answer, expected),
            f1: Some(f1(answer, expected)),
            exact: Some(exact_match(answer, expected)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn golds(g: &[&str]) -> Vec<String> {
        g.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn normalisation_drops_case_punctuation_and_articles() {
        assert_eq!(
            normalize("  The Eiffel-Tower, in PARIS!  "),
            "eiffel tower in paris"
        );
        assert_eq!(normalize("a an the"), "");
    }

    #[test]
    fn sub_em_counts_containment_either_way() {
        let g = golds(&["Eiffel Tower"]);
        assert_eq!(sub_em("It is the Eiffel Tower.", &g), 1.0);
        assert_eq!(sub_em("Eiffel", &g), 1.0, "the prediction inside the gold");
        assert_eq!(sub_em("", &g), 0.0, "empty predicts nothing");
        assert_eq!(sub_em("the", &g), 0.0, "only an article is empty too");
        assert_eq!(sub_em("Eifel Tower", &g), 0.0, "a near miss");
        assert_eq!(sub_em("Louvre", &golds(&["Eiffel Tower", "Louvre"])), 1.0);
    }

    #[test]
    fn f1_and_exact_match() {
        let g = golds(&["the Eiffel Tower"]);
        assert_eq!(exact_match("Eiffel tower!", &g), 1.0);
        assert_eq!(exact_match("Eiffel", &g), 0.0);
        assert!((f1("Eiffel", &g) - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(f1("", &g), 0.0);
        assert_eq!(f1("Louvre museum", &g), 0.0);
        assert_eq!(f1("eiffel tower", &g), 1.0);
    }

    #[test]
    fn recall_needs_every_value() {
        let e = golds(&["1234567", "7654321"]);
        assert_eq!(recall_all("1234567 and 7654321", &e), 1.0);
        assert_eq!(recall_all("1234567", &e), 0.5);
        assert_eq!(recall_all("123456", &e), 0.0, "a near miss");
        assert_eq!(recall_all("", &e), 0.0);
        assert_eq!(recall_all("VAR abcde", &golds(&["ABCDE"])), 1.0);
    }

    #[test]
    fn task_names_round_trip() {
        for t in ALL_TASKS {
            assert_eq!(t.name().parse::<Task>().unwrap(), *t);
        }
        assert!("niah".parse::<Task>().is_err());
    }
}
