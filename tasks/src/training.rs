//! Training trajectories of the memory-agent workflow with oracle memories.
//!
//! The generator plants the facts, so the ideal memory after every chunk is known:
//!
//! - question mode (the published MemAgent update and final templates): facts relevant
//!   to the problem enter the memory when their chunk is read and stay verbatim; facts
//!   about other keys (distractors) never enter; a value that changes replaces the old
//!   line; multi-hop chains keep both links; the final step answers in `\boxed{}`.
//! - general mode (memagent's question-free templates): chats between a user and an
//!   assistant, two people over dated sessions, and dated notes, with durable facts
//!   (names, relations, preferences, dates, decisions, open tasks), updates that replace
//!   older facts and small talk that never enters memory; the oracle memory is the
//!   current facts, one per line.
//!
//! Every example is a pure function of (seed, split, index). The validation split has
//! its own sentence patterns, keys, questions and one filler (generated field reports)
//! that training never sees.

use std::collections::BTreeSet;

use memagent_agent::{
    Template, TextTokenizer, Writer, FINAL_BOXED, GENERAL_ANSWER, GENERAL_LINES, GENERAL_UPDATE,
    NO_MEMORY, UPDATE,
};
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::haystack::Haystack;
use crate::ruler::{compose, CITIES};

mod dialogue;
mod evidence;
pub use evidence::EVIDENCE_FAMILIES;

/// Which patterns, keys and fillers a trajectory draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    Train,
    Validation,
}

/// The question-mode families, drawn uniformly.
pub const QUESTION_FAMILIES: [&str; 7] = [
    "single",
    "multikey",
    "multivalue",
    "multiquery",
    "update",
    "multihop",
    "vt",
];

/// The memory of a question-mode trajectory before anything relevant was read.
pub const NOTHING_YET: &str = "No relevant information so far.";

/// Sizes of generated trajectories.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct DataConfig {
    pub seed: u64,
    /// Chunk sizes are drawn from this range (tokens).
    pub chunk_min: usize,
    pub chunk_max: usize,
    /// The memory cap M: oracle memories never exceed it.
    pub memory_tokens: usize,
    /// Share of general-mode trajectories (the rest are question mode).
    pub general_share: f64,
    /// Share of examples that answer a question from passages found for it (the
    /// evidence prompt of `memctl query`) in place of a trajectory's conversation.
    #[serde(default)]
    pub evidence_share: f64,
    /// Share of the evidence examples that are chat exchanges (a few dated turns of two
    /// people, the fact said in a reply), the passages an answer reads from a chat log.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dialogue_share: f64,
    /// Share of the chat exchanges whose answer is "not known": the exchange left out,
    /// or the other speaker saying it of themselves (a quarter of them).
    #[serde(
        default = "default_dialogue_unknown_share",
        skip_serializing_if = "is_default_dialogue_unknown_share"
    )]
    pub dialogue_unknown_share: f64,
    /// How general-mode update steps write the memory: the whole memory rewritten, or
    /// only the chunk's new facts as lines (`memctl ingest --writer lines`).
    #[serde(default, skip_serializing_if = "is_rewrite")]
    pub writer: Writer,
}

fn is_zero(share: &f64) -> bool {
    *share == 0.0
}

/// The share of chat exchanges answered "not known" that the shipped reader was trained
/// with ([`DataConfig::dialogue_unknown_share`]).
pub const DIALOGUE_UNKNOWN_SHARE: f64 = 0.2;

fn default_dialogue_unknown_share() -> f64 {
    DIALOGUE_UNKNOWN_SHARE
}

fn is_default_dialogue_unknown_share(share: &f64) -> bool {
    *share == DIALOGUE_UNKNOWN_SHARE
}

fn is_rewrite(w: &Writer) -> bool {
    *w == Writer::Rewrite
}

impl Default for DataConfig {
    fn default() -> Self {
        Self {
            seed: 1,
            chunk_min: 256,
            chunk_max: 1024,
            memory_tokens: 256,
            general_share: 0.35,
            evidence_share: 0.0,
            dialogue_share: 0.0,
            dialogue_unknown_share: DIALOGUE_UNKNOWN_SHARE,
            writer: Writer::Rewrite,
        }
    }
}

/// The oracle general memory before any fact.
/// The oracle's memory of a general-mode trajectory before any fact was said.
pub const NO_FACTS: &str = "No facts yet.";

/// The fillers a split draws from.
pub struct Fillers {
    /// Training: the shared essays (when present), RULER noise, generated small talk.
    /// Validation: generated field reports only.
    pub list: Vec<(String, Haystack)>,
}

impl Fillers {
    /// The fillers of `split`; `essays` is the shared essay haystack when available.
    pub fn new(split: Split, essays: Option<Haystack>) -> Result<Self> {
        let mut list = Vec::new();
        match split {
            Split::Train => {
                if let Some(e) = essays {
                    list.push(("essays".to_string(), e));
                }
                list.push(("noise".to_string(), Haystack::noise()));
                list.push((
                    "small-talk".to_string(),
                    Haystack::from_text(&generated(SMALL_TALK, 0x5A11, 4000), "small talk")?,
                ));
            }
            Split::Validation => list.push(("field-reports".to_string(), validation_filler()?)),
        }
        Ok(Self { list })
    }
}

/// The validation splits' filler (generated field reports), which no benchmark and no
/// training data uses.
pub fn validation_filler() -> Result<Haystack> {
    Haystack::from_text(
        &generated(REPORTS, 0xF1E1D, 4000),
        "generated field reports",
    )
}

/// One step of a trajectory: the chunk read and the memory before and after it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Step {
    pub chunk: String,
    pub memory_before: String,
    pub memory_after: String,
    /// Planted sentences in this chunk that are relevant (must enter the memory).
    pub relevant: Vec<String>,
    /// Planted sentences in this chunk that are not (must stay out).
    pub distractors: Vec<String>,
    /// General mode: the values each relevant sentence states (in `relevant`'s order); a
    /// reply keeps the fact when it holds them all.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<Vec<String>>,
}

/// Which templates a trajectory uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Question,
    General,
}

/// A whole workflow run with its oracle memories.
#[derive(Debug, Clone, Serialize)]
pub struct Trajectory {
    pub mode: Mode,
    pub family: &'static str,
    pub filler: String,
    /// The problem (question mode) or a question asked of the general memory.
    pub question: String,
    pub steps: Vec<Step>,
    /// The oracle final reply.
    pub answer: String,
    /// Values a correct answer holds.
    pub expected: Vec<String>,
    /// Lines the final memory must hold (the current relevant facts).
    pub memory_lines: Vec<String>,
    /// General mode: the values each memory line states (names, places, dates), in the
    /// order of `memory_lines`; a paraphrased memory keeps a fact when it holds them all.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fact_values: Vec<Vec<String>>,
}

/// One training conversation: a user message and the reply to learn.
#[derive(Debug, Clone, Serialize)]
pub struct Example {
    pub family: &'static str,
    pub mode: Mode,
    /// `update` or `final`.
    pub kind: &'static str,
    pub template: Template,
    pub message: String,
    pub target: String,
    /// The memory the update step started from (`None` for the final answer): lines of
    /// the target not in it are what the step had to notice.
    pub memory_before: Option<String>,
    /// Values the target states (evidence examples).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
    /// Earlier values the passages gave and the target must not (evidence examples).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stale: Vec<String>,
}

impl Trajectory {
    /// The conversations of this trajectory: every update step, then the final answer.
    /// With the line writer, a general-mode update's target is only the lines the step
    /// adds or changes (NONE when it adds none), as the merge expects them.
    pub fn examples(&self, writer: Writer) -> Vec<Example> {
        let lines = self.mode == Mode::General && writer == Writer::Lines;
        let (update, answer) = match self.mode {
            Mode::Question => (UPDATE, FINAL_BOXED),
            Mode::General if lines => (GENERAL_LINES, GENERAL_ANSWER),
            Mode::General => (GENERAL_UPDATE, GENERAL_ANSWER),
        };
        let question = match self.mode {
            Mode::Question => self.question.as_str(),
            Mode::General => "",
        };
        let mut out: Vec<Example> = self
            .steps
            .iter()
            .map(|s| Example {
                family: self.family,
                mode: self.mode,
                kind: "update",
                template: update,
                message: update.fill(question, &s.memory_before, &s.chunk),
                target: if lines {
                    let before: Vec<&str> = s.memory_before.lines().collect();
                    let new: Vec<&str> = s
                        .memory_after
                        .lines()
                        .filter(|l| !l.trim().is_empty() && !before.contains(l))
                        .filter(|l| *l != NO_FACTS)
                        .collect();
                    if new.is_empty() {
                        "NONE".to_string()
                    } else {
                        new.join("\n")
                    }
                } else {
                    s.memory_after.clone()
                },
                memory_before: Some(s.memory_before.clone()),
                values: Vec::new(),
                stale: Vec::new(),
            })
            .collect();
        let last = self.steps.last().map_or(NO_MEMORY, |s| &s.memory_after);
        out.push(Example {
            family: self.family,
            mode: self.mode,
            kind: "final",
            template: answer,
            message: answer.fill(&self.question, last, ""),
            target: self.answer.clone(),
            memory_before: None,
            values: Vec::new(),
            stale: Vec::new(),
        });
        out
    }
}

/// Example number `index` of a split: one conversation of trajectory `index`, drawn so
/// that updates and final answers both appear.
pub fn example(
    tokenizer: &dyn TextTokenizer,
    fillers: &Fillers,
    config: &DataConfig,
    split: Split,
    index: u64,
) -> Result<Example> {
    let mut rng = rng_for(config.seed ^ 0x00E8_A391, split, index);
    if config.evidence_share > 0.0 && rng.random_bool(config.evidence_share.min(1.0)) {
        let patterns = Patterns::of(split);
        if config.dialogue_share > 0.0 && rng.random_bool(config.dialogue_share.min(1.0)) {
            return Ok(dialogue::dialogue_example(
                patterns,
                config.dialogue_unknown_share,
                &mut rng,
            ));
        }
        return Ok(evidence::evidence_example(patterns, &mut rng));
    }
    let t = trajectory(tokenizer, fillers, config, split, index)?;
    let mut examples = t.examples(config.writer);
    // Finals are one conversation of n + 1; draw them a little more often than that.
    let pick = if rng.random_bool(0.2) {
        examples.len() - 1
    } else {
        rng.random_range(0..examples.len())
    };
    Ok(examples.swap_remove(pick))
}

fn rng_for(seed: u64, split: Split, index: u64) -> StdRng {
    let salt = match split {
        Split::Train => 0x7124_11A5_u64,
        Split::Validation => 0x0FA1_1DA7_u64 << 20,
    };
    StdRng::seed_from_u64(
        seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03),
    )
}

/// Trajectory number `index` of a split.
pub fn trajectory(
    tokenizer: &dyn TextTokenizer,
    fillers: &Fillers,
    config: &DataConfig,
    split: Split,
    index: u64,
) -> Result<Trajectory> {
    if fillers.list.is_empty() {
        return Err(Error::InvalidRequest(
            "no filler to build trajectories from".into(),
        ));
    }
    if config.chunk_min == 0 || config.chunk_min > config.chunk_max {
        return Err(Error::InvalidRequest(format!(
            "chunk sizes {}..{} are not a range of positive token counts",
            config.chunk_min, config.chunk_max
        )));
    }
    let mut rng = rng_for(config.seed, split, index);
    let p = Patterns::of(split);
    if rng.random_bool(config.general_share) {
        general(tokenizer, config, p, &mut rng)
    } else {
        let (name, haystack) = fillers.list.choose(&mut rng).expect("non-empty");
        question(tokenizer, config, p, name, haystack, &mut rng)
    }
}

// ---------------------------------------------------------------------------------------
// Surface forms. Training and validation share none.

struct Patterns {
    /// A fact: {kind} of {key} is {value}.
    facts: &'static [&'static str],
    /// Question about one key.
    ask_one: &'static [&'static str],
    /// Question about all values of one key.
    ask_all: &'static [&'static str],
    /// Question about several keys ({keys}).
    ask_many: &'static [&'static str],
    /// A value changes: {kind} of {key} is now {value}.
    changes: &'static [&'static str],
    kinds: &'static [&'static str],
    keys: &'static [&'static str],
    people: &'static [&'static str],
    places: &'static [&'static str],
    /// Multi-hop: {a} is {b}'s {rel}. / {b} lives in {place}.
    relation: &'static [&'static str],
    lives: &'static [&'static str],
    ask_hop: &'static [&'static str],
    /// Variable tracking.
    assign: &'static [&'static str],
    copy: &'static [&'static str],
    ask_vars: &'static [&'static str],
    /// General mode: the user's or a person's facts (said, and as remembered).
    chat: &'static [(&'static str, &'static str, &'static str)],
    chat_updates: &'static [(&'static str, &'static str, &'static str)],
    openers: &'static [&'static str],
    /// How a speaker flags a fact ("Please remember this: my sister …").
    remind: &'static [&'static str],
    /// The other party's acknowledgement; `{echo}` is the fact in the second person.
    acks: &'static [&'static str],
    /// Passing remarks that sound like facts but are not durable (what happened today,
    /// what was eaten or watched): each a list of fragment lists, one drawn from each.
    passing: &'static [&'static [&'static [&'static str]]],
    /// Chat exchanges: a turn asking, the reply that says a fact, the question on it.
    exchanges: &'static [dialogue::Exchange],
}

impl Patterns {
    fn of(split: Split) -> &'static Patterns {
        match split {
            Split::Train => &TRAIN,
            Split::Validation => &VALIDATION,
        }
    }
}

static TRAIN: Patterns = Patterns {
    facts: &[
        "One of the special magic {kind}s for {key} is: {value}.",
        "The special magic {kind} for {key} is {value}.",
        "Remember this: the {kind} of {key} is {value}.",
        "{key}'s {kind} is {value}.",
        "For the record, {key} has the {kind} {value}.",
        "Note that the {kind} assigned to {key} is {value}.",
        "The {kind} registered for {key} is {value}.",
        "Important: {key} uses the {kind} {value}.",
    ],
    ask_one: &[
        "What is the special magic {kind} for {key} mentioned in the provided text?",
        "What is the {kind} of {key}?",
        "Which {kind} belongs to {key}?",
        "Find the {kind} given for {key} in the text.",
    ],
    ask_all: &[
        "What are all the special magic {kind}s for {key} mentioned in the provided text?",
        "List every {kind} given for {key}.",
    ],
    ask_many: &[
        "What are all the special magic {kind}s for {keys} mentioned in the provided text?",
        "What are the {kind}s of {keys}?",
    ],
    changes: &[
        "Update: the {kind} of {key} has changed to {value}.",
        "Correction: {key}'s {kind} is now {value}.",
        "From today the {kind} for {key} is {value} instead.",
    ],
    kinds: &["number", "code", "password", "word", "id"],
    keys: CITIES,
    people: &[
        "Alice",
        "Boris",
        "Carmen",
        "Deniz",
        "Elena",
        "Farid",
        "Greta",
        "Hiro",
        "Ines",
        "Jonas",
        "Kemal",
        "Lena",
        "Marco",
        "Nadia",
        "Oskar",
        "Petra",
        "Rahul",
        "Sofia",
        "Tomas",
        "Ursula",
        "Viktor",
        "Wanda",
        "Yusuf",
        "Zoe",
        "Bartholomew",
        "Ottoline",
        "Cornelius",
        "Philippa",
        "Thaddeus",
        "Ysolde",
        "Anastasia",
        "Maximilian",
        "Rosalind",
        "Leocadia",
        "Evangeline",
        "Florian",
        "Isidora",
        "Quentin",
        "Seraphina",
        "Wilhelmina",
        "Octavia",
        "Benedikt",
        "Clementine",
        "Dorothea",
        "Eulalia",
        "Tiberius",
    ],
    places: &[
        "Porto",
        "Krakow",
        "Valencia",
        "Ghent",
        "Turku",
        "Bergen",
        "Split",
        "Leeds",
        "Lyon",
        "Graz",
        "Bruges",
        "Aarhus",
        "Cork",
        "Bologna",
        "Sevilla",
        "Tartu",
        "Ulaanbaatar",
        "Nairobi",
        "Valparaiso",
        "Edinburgh",
        "Marrakesh",
        "Ljubljana",
        "Winnipeg",
        "Auckland",
        "Cusco",
        "Hanoi",
        "Tallinn",
        "Zanzibar",
    ],
    relation: &[
        "{a} is the {rel} of {b}.",
        "{b}'s {rel} is {a}.",
        "{a} is {b}'s {rel}.",
    ],
    lives: &[
        "{b} lives in {place}.",
        "{b} has an apartment in {place}.",
        "{b} moved to {place} years ago.",
    ],
    ask_hop: &[
        "In which city does the {rel} of {b2} live?",
        "Where does {b2}'s {rel} live?",
    ],
    assign: &[
        "VAR {x} = {value}.",
        "Let {x} be {value}.",
        "{x} := {value}.",
        "Assign {value} to {x}.",
        "{x} is set to {value}.",
        "Store {value} in {x}.",
    ],
    copy: &[
        "VAR {y} = VAR {x}.",
        "Let {y} be {x}.",
        "{y} := {x}.",
        "Copy {x} into {y}.",
        "{y} takes the value of {x}.",
        "Make {y} equal to {x}.",
    ],
    ask_vars: &[
        "Find all variables that are assigned the value {value} in the text above.",
        "Which variables end up holding the value {value}?",
        "List the variables that hold {value} at the end.",
    ],
    chat: &[
        (
            "My name is {name}, by the way.",
            "The user's name is {name}.",
            "What is the user's name?",
        ),
        (
            "I was born on {date}.",
            "The user's birthday is {date}.",
            "When is the user's birthday?",
        ),
        (
            "My birthday is {date}, don't forget!",
            "The user's birthday is {date}.",
            "When is the user's birthday?",
        ),
        (
            "I live in {place} now.",
            "The user lives in {place}.",
            "Where does the user live?",
        ),
        (
            "My sister {name2} is visiting next week.",
            "The user's sister is {name2}.",
            "What is the name of the user's sister?",
        ),
        (
            "I'm allergic to {food}.",
            "The user is allergic to {food}.",
            "What is the user allergic to?",
        ),
        (
            "I really can't stand {food}.",
            "The user dislikes {food}.",
            "What food does the user dislike?",
        ),
        (
            "My favourite food is {food}.",
            "The user's favourite food is {food}.",
            "What is the user's favourite food?",
        ),
        (
            "I work as a {job}.",
            "The user works as a {job}.",
            "What is the user's job?",
        ),
        (
            "We decided to book the {item} for {date}.",
            "Decision: book the {item} for {date}.",
            "What was decided about the {item}?",
        ),
        (
            "I still need to renew my {item} before {date}.",
            "Open task: renew the {item} before {date}.",
            "What does the user still need to do?",
        ),
        (
            "My dog is called {pet}.",
            "The user's dog is called {pet}.",
            "What is the user's dog called?",
        ),
        (
            "My {rel} {name2} lives in {place}.",
            "The user's {rel} {name2} lives in {place}.",
            "Where does the user's {rel} live?",
        ),
        (
            "My {rel} is called {name2} and lives in {place}.",
            "The user's {rel} {name2} lives in {place}.",
            "In which city does the user's {rel} live?",
        ),
        (
            "My {rel} {name2} works as a {job}.",
            "The user's {rel} {name2} works as a {job}.",
            "What is the job of the user's {rel}?",
        ),
        (
            "Our anniversary is on {date}.",
            "The user's anniversary is {date}.",
            "When is the user's anniversary?",
        ),
        (
            "{name2}, my {rel}, keeps a dog; its name is {pet}.",
            "The user's {rel} {name2} has a dog called {pet}.",
            "What's the name of the dog {name2} keeps?",
        ),
        (
            "{name2} from next door is a {job} at the hospital.",
            "The user's neighbour {name2} works as a {job}.",
            "What job does {name2} have?",
        ),
        (
            "Name's {name}, nice to meet you.",
            "The user's name is {name}.",
            "What is the user's name?",
        ),
        (
            "You can write me down as {name}.",
            "The user's name is {name}.",
            "What is the user's name?",
        ),
        (
            "I turn a year older on {date}.",
            "The user's birthday is {date}.",
            "When is the user's birthday?",
        ),
        (
            "{date} is my birthday, so save the day.",
            "The user's birthday is {date}.",
            "When is the user's birthday?",
        ),
        (
            "I've been renting a flat in {place} since spring.",
            "The user lives in {place}.",
            "Where does the user live?",
        ),
        (
            "{place} is where I live.",
            "The user lives in {place}.",
            "Where does the user live?",
        ),
        (
            "{food} gives me a rash, so none for me.",
            "The user is allergic to {food}.",
            "What is the user allergic to?",
        ),
        (
            "I can't eat {food}, I'm allergic.",
            "The user is allergic to {food}.",
            "What is the user allergic to?",
        ),
        (
            "{food} is the one thing I won't eat.",
            "The user dislikes {food}.",
            "What food does the user dislike?",
        ),
        (
            "Nothing beats {food}, it's my favourite.",
            "The user's favourite food is {food}.",
            "What is the user's favourite food?",
        ),
        (
            "My job? I'm a {job}.",
            "The user works as a {job}.",
            "What is the user's job?",
        ),
        (
            "I've been a {job} for ten years.",
            "The user works as a {job}.",
            "What is the user's job?",
        ),
        (
            "Over in {place} lives my {rel}, {name2}.",
            "The user's {rel} {name2} lives in {place}.",
            "Where does the user's {rel} live?",
        ),
        (
            "We have a dog, {pet} is her name.",
            "The user's dog is called {pet}.",
            "What is the user's dog called?",
        ),
        // Further wordings, so that the writer learns what a fact is rather than a
        // handful of sentences: the same facts said casually, inverted or in passing.
        (
            "Everyone knows me as {name}.",
            "The user's name is {name}.",
            "What is the user's name?",
        ),
        (
            "Oh, I never told you my name: it's {name}.",
            "The user's name is {name}.",
            "What is the user's name?",
        ),
        (
            "{name} here, hello again!",
            "The user's name is {name}.",
            "What is the user's name?",
        ),
        (
            "The name on my passport is {name}.",
            "The user's name is {name}.",
            "What is the user's name?",
        ),
        (
            "My birthday falls on {date}.",
            "The user's birthday is {date}.",
            "When is the user's birthday?",
        ),
        (
            "I'm throwing a party on {date}, it's my birthday.",
            "The user's birthday is {date}.",
            "When is the user's birthday?",
        ),
        (
            "Wish me a happy birthday on {date}!",
            "The user's birthday is {date}.",
            "When is the user's birthday?",
        ),
        (
            "Home for me is {place}.",
            "The user lives in {place}.",
            "Where does the user live?",
        ),
        (
            "I've settled down in {place} for good.",
            "The user lives in {place}.",
            "Where does the user live?",
        ),
        (
            "We bought a house in {place} last year and live there.",
            "The user lives in {place}.",
            "Where does the user live?",
        ),
        (
            "I break out in hives whenever I eat {food}.",
            "The user is allergic to {food}.",
            "What is the user allergic to?",
        ),
        (
            "My doctor says I'm allergic to {food}.",
            "The user is allergic to {food}.",
            "What is the user allergic to?",
        ),
        (
            "One bite of {food} and my throat swells up.",
            "The user is allergic to {food}.",
            "What is the user allergic to?",
        ),
        (
            "Keep {food} away from me, I react badly to it.",
            "The user is allergic to {food}.",
            "What is the user allergic to?",
        ),
        (
            "Ugh, I hate {food}.",
            "The user dislikes {food}.",
            "What food does the user dislike?",
        ),
        (
            "Please never serve me {food}, I can't bear the taste.",
            "The user dislikes {food}.",
            "What food does the user dislike?",
        ),
        (
            "I've never liked {food}.",
            "The user dislikes {food}.",
            "What food does the user dislike?",
        ),
        (
            "I could eat {food} every single day.",
            "The user's favourite food is {food}.",
            "What is the user's favourite food?",
        ),
        (
            "I love {food} more than any other dish.",
            "The user's favourite food is {food}.",
            "What is the user's favourite food?",
        ),
        (
            "At work I'm a {job}.",
            "The user works as a {job}.",
            "What is the user's job?",
        ),
        (
            "I'm a {job} by trade.",
            "The user works as a {job}.",
            "What is the user's job?",
        ),
        (
            "I got hired as a {job} last year and still love it.",
            "The user works as a {job}.",
            "What is the user's job?",
        ),
        (
            "{name2} is my {rel}, and they are based in {place}.",
            "The user's {rel} {name2} lives in {place}.",
            "Where does the user's {rel} live?",
        ),
        (
            "My {rel}, {name2}, stays in {place}.",
            "The user's {rel} {name2} lives in {place}.",
            "Where does the user's {rel} live?",
        ),
        (
            "{name2}, my {rel}, is a {job}.",
            "The user's {rel} {name2} works as a {job}.",
            "What is the job of the user's {rel}?",
        ),
        (
            "Our dog {pet} is asleep next to me.",
            "The user's dog is called {pet}.",
            "What is the user's dog called?",
        ),
        (
            "Final answer on the {item}: {date} it is.",
            "Decision: book the {item} for {date}.",
            "What was decided about the {item}?",
        ),
        (
            "Note to self, the {item} needs renewing by {date}.",
            "Open task: renew the {item} before {date}.",
            "What does the user still need to do?",
        ),
        (
            "We got married on {date}.",
            "The user's anniversary is {date}.",
            "When is the user's anniversary?",
        ),
    ],
    chat_updates: &[
        (
            "Actually I just moved to {place}.",
            "The user lives in {place}.",
            "Where does the user live?",
        ),
        (
            "I changed jobs, I'm a {job} now.",
            "The user works as a {job}.",
            "What is the user's job?",
        ),
        (
            "My {rel} {name2} packed up and settled in {place}.",
            "The user's {rel} {name2} lives in {place}.",
            "Where does the user's {rel} live?",
        ),
        (
            "{name2}, my {rel}, started a new job as a {job}.",
            "The user's {rel} {name2} works as a {job}.",
            "What is the job of the user's {rel}?",
        ),
        (
            "Sadly we lost our old dog; the rescue pup we took in is {pet}.",
            "The user's dog is called {pet}.",
            "What is the user's dog called?",
        ),
        (
            "I've gone off my old favourite, now it's {food} all the way.",
            "The user's favourite food is {food}.",
            "What is the user's favourite food?",
        ),
        (
            "My {rel} {name2}'s dog ran off, so {name2} got a new one and named it {pet}.",
            "The user's {rel} {name2} has a dog called {pet}.",
            "What's the name of the dog {name2} keeps?",
        ),
        (
            "{name2} from next door left the hospital and is a {job} now.",
            "The user's neighbour {name2} works as a {job}.",
            "What job does {name2} have?",
        ),
        (
            "The {item} got moved, it's booked for {date} now.",
            "Decision: book the {item} for {date}.",
            "What was decided about the {item}?",
        ),
    ],
    openers: &[
        "Hi! How are you today?",
        "Haha, that's funny.",
        "The weather is lovely this morning.",
        "Thanks, that helps a lot.",
        "Did you watch the match yesterday?",
        "I had coffee with a friend, nothing special.",
        "Okay, sounds good to me.",
        "I'm a bit tired today, long week.",
        "That reminds me of a film I saw once.",
        "Sure, no problem at all.",
        "What a busy afternoon it has been.",
        "I think I'll go for a walk later.",
        "Haha, nice one.",
        "Omg, really?",
        "Ugh, Mondays.",
        "Meh, whatever.",
        "Hmm, not sure.",
        "Yikes!",
        "Brb, coffee.",
        "Wow, okay.",
        "Heh, true.",
        "Yep.",
    ],
    remind: &[
        "Please remember this: ",
        "Don't forget: ",
        "Just so you know, ",
        "Remember that ",
        "Keep this in mind: ",
    ],
    acks: &[
        "Noted: {echo}",
        "Got it, {echo}",
        "Okay, so {echo}",
        "Thanks, I'll keep that in mind.",
        "Good to know!",
        "Sure, I'll remember that.",
    ],
    passing: &[
        &[
            &[
                "My bus",
                "The tram",
                "The delivery",
                "My flight",
                "The meeting",
                "The plumber",
            ],
            &[
                "was late",
                "got cancelled",
                "came early",
                "was moved",
                "took ages",
            ],
            &[
                "this morning.",
                "again today.",
                "yesterday.",
                "an hour ago.",
            ],
        ],
        &[
            &["I had", "I cooked", "I ordered", "We grabbed"],
            &["pasta", "a salad", "tacos", "sushi", "pancakes", "curry"],
            &[
                "for lunch.",
                "for dinner tonight.",
                "at the office.",
                "on the way home.",
            ],
        ],
        &[
            &["I watched", "I read", "I listened to"],
            &[
                "a film about",
                "a podcast about",
                "an article about",
                "a show about",
            ],
            &["volcanoes", "old cars", "the desert", "chess", "bees"],
            &["last night.", "on the way home.", "today."],
        ],
        &[
            &["That sounds", "That must have been", "Sounds"],
            &["nice.", "tiring.", "like fun.", "stressful.", "lovely."],
            &[
                "Tell me more.",
                "Hope the rest of the day is calm.",
                "Enjoy it!",
            ],
        ],
        &[
            &[
                "The neighbours",
                "My colleague",
                "A friend of mine",
                "The kids next door",
            ],
            &["painted", "fixed", "cleaned", "sold"],
            &["their car", "the roof", "an old bike", "the garage"],
            &["last weekend.", "this morning.", "today."],
        ],
    ],
    exchanges: dialogue::TRAIN_EXCHANGES,
};

static VALIDATION: Patterns = Patterns {
    facts: &[
        "Keep in mind that {key} goes with the {kind} {value}.",
        "The archive lists {value} as the {kind} tied to {key}.",
        "According to the ledger, {key} -> {kind} {value}.",
        "A {kind} was recorded for {key}: {value}.",
    ],
    ask_one: &[
        "Tell me the {kind} that goes with {key}.",
        "Which {kind} does the text tie to {key}?",
    ],
    ask_all: &["Give all {kind}s that the text ties to {key}."],
    ask_many: &["Report the {kind}s that go with {keys}."],
    changes: &["Revision notice: {key} now carries the {kind} {value}."],
    kinds: &["serial", "token", "pin"],
    keys: &[
        "the copper kettle",
        "the north gate",
        "the violet ledger",
        "the quiet harbor",
        "the iron bridge",
        "the amber lantern",
        "the silver orchard",
        "the old mill",
        "the green tram",
        "the hidden garden",
        "the stone tower",
        "the paper kite",
    ],
    people: &[
        "Aurelio", "Brigida", "Casimir", "Delphine", "Evander", "Fiora", "Gideon", "Hermione",
        "Ignatius", "Juniper", "Leopold", "Marisol",
    ],
    places: &[
        "Reykjavik",
        "Tbilisi",
        "Montevideo",
        "Hobart",
        "Windhoek",
        "Kyoto",
        "Quito",
        "Perth",
    ],
    relation: &["{a} and {b} are related: {a} is the {rel}."],
    lives: &["The home of {b} is in {place}."],
    ask_hop: &["Name the city where the {rel} of {b2} has a home."],
    assign: &["SET {x} TO {value}."],
    copy: &["SET {y} TO {x}."],
    ask_vars: &["Name every variable whose value ends up being {value}."],
    chat: &[
        (
            "People call me {name}.",
            "The user's name is {name}.",
            "What is the user called?",
        ),
        (
            "Mark {date} in your calendar, it's my birthday.",
            "The user's birthday is {date}.",
            "On which date is the user's birthday?",
        ),
        (
            "These days my home is in {place}.",
            "The user lives in {place}.",
            "In which city is the user's home?",
        ),
        (
            "{food} makes me sick, I avoid it.",
            "The user is allergic to {food}.",
            "Which food must the user avoid?",
        ),
        (
            "By profession I'm a {job}.",
            "The user works as a {job}.",
            "What does the user do for a living?",
        ),
        (
            "{name2}, my {rel}, has a home in {place}.",
            "The user's {rel} {name2} lives in {place}.",
            "In which city is the home of the user's {rel}?",
        ),
    ],
    chat_updates: &[(
        "Big news: I relocated to {place}.",
        "The user lives in {place}.",
        "In which city is the user's home?",
    )],
    openers: &[
        "Morning! Slept well?",
        "Lol, classic.",
        "Rain again, typical.",
        "Cheers for that.",
        "Not much going on here.",
        "Fine by me.",
    ],
    remind: &["For your records, "],
    acks: &["Understood, {echo}", "Duly noted."],
    passing: &[
        &[
            &["The ferry", "Our taxi", "The courier", "The lecture"],
            &["ran late", "was delayed", "was rescheduled"],
            &["this evening.", "once more.", "earlier on."],
        ],
        &[
            &[
                "For breakfast I ate",
                "Tonight we're having",
                "I snacked on",
            ],
            &["toast", "noodles", "an omelette", "porridge"],
            &["again.", "at home.", "before work."],
        ],
        &[
            &["Been binge-watching", "Just finished"],
            &["a series about", "a novel about"],
            &["pirates", "space travel", "gardening"],
            &["all week.", "last weekend."],
        ],
    ],
    exchanges: dialogue::VALIDATION_EXCHANGES,
};

const RELATIONS: &[&str] = &["sister", "brother", "cousin", "mother", "father", "friend"];
const FOODS: &[&str] = &[
    "peanuts",
    "shellfish",
    "cilantro",
    "mushrooms",
    "olives",
    "strawberries",
    "gluten",
    "blue cheese",
    "sushi",
    "lasagna",
    "curry",
    "pancakes",
];
const JOBS: &[&str] = &[
    "nurse",
    "teacher",
    "carpenter",
    "data analyst",
    "pilot",
    "baker",
    "lawyer",
    "architect",
    "veterinarian",
    "translator",
];
const ITEMS: &[&str] = &[
    "passport",
    "flight",
    "hotel",
    "venue",
    "car",
    "dentist appointment",
];
const PETS: &[&str] = &["Biscuit", "Luna", "Pepper", "Rocky", "Milo", "Nala"];
pub(crate) const MONTHS: &[&str] = &[
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Sentence fragments of the generated fillers.
const SMALL_TALK: &[&[&str]] = &[
    &[
        "Honestly,",
        "Well,",
        "You know,",
        "Anyway,",
        "So",
        "I guess",
    ],
    &[
        "the traffic",
        "my neighbour",
        "the new cafe",
        "this weather",
        "the weekend",
        "the game",
    ],
    &["was", "seemed", "felt", "turned out"],
    &[
        "pretty relaxing.",
        "a bit chaotic.",
        "nicer than expected.",
        "totally fine.",
        "so loud.",
        "quite boring.",
    ],
];
const REPORTS: &[&[&str]] = &[
    &[
        "At dawn",
        "By noon",
        "Late in the evening",
        "During the survey",
        "After the storm",
    ],
    &[
        "the field team",
        "the drone crew",
        "the river gauge",
        "station seven",
        "the second patrol",
    ],
    &["logged", "measured", "noted", "reported"],
    &[
        "steady winds from the west.",
        "a slight rise in the water level.",
        "no unusual activity.",
        "dense fog over the valley.",
        "three migrating flocks.",
    ],
];

/// Deterministic text of `sentences` sentences from fragment lists.
fn generated(parts: &[&[&str]], seed: u64, sentences: usize) -> String {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = String::new();
    for _ in 0..sentences {
        for (i, part) in parts.iter().enumerate() {
            if i > 0 || !out.is_empty() {
                out.push(' ');
            }
            out.push_str(part.choose(&mut rng).expect("fragments"));
        }
    }
    out
}

fn fill(pattern: &str, pairs: &[(&str, &str)]) -> String {
    let mut s = pattern.to_string();
    for (k, v) in pairs {
        // "a {job}" before a vowel reads "an architect".
        if v.starts_with(['a', 'e', 'i', 'o']) {
            s = s.replace(&format!(" a {{{k}}}"), &format!(" an {{{k}}}"));
        }
        s = s.replace(&format!("{{{k}}}"), v);
    }
    // A sentence starts with a capital letter even when a key ("the north gate") opens it.
    let mut chars = s.chars();
    match chars.next() {
        Some(c) if c.is_lowercase() => c.to_uppercase().chain(chars).collect(),
        _ => s,
    }
}

fn value_of(kind: &str, rng: &mut StdRng) -> String {
    match kind {
        "word" | "password" | "token" => {
            const C: &[u8] = b"bdfgklmnprstvz";
            const V: &[u8] = b"aeiou";
            (0..3)
                .flat_map(|_| {
                    [
                        C[rng.random_range(0..C.len())] as char,
                        V[rng.random_range(0..V.len())] as char,
                    ]
                })
                .collect()
        }
        "code" | "serial" => format!(
            "{}{}-{}",
            (b'A' + rng.random_range(0..26u8)) as char,
            (b'A' + rng.random_range(0..26u8)) as char,
            rng.random_range(1000..10000)
        ),
        "pin" => rng.random_range(1000..10000).to_string(),
        _ => rng.random_range(1_000_000u32..10_000_000).to_string(),
    }
}

/// Distinct picks from a list.
fn picks<'a>(list: &[&'a str], n: usize, rng: &mut StdRng) -> Vec<&'a str> {
    let mut v = list.to_vec();
    v.shuffle(rng);
    v.truncate(n);
    v
}

/// A planted sentence: its text, the chunk it goes in, and whether it is relevant.
struct Plant {
    text: String,
    chunk: usize,
    relevant: bool,
    /// A later relevant line that supersedes this one (an updated value).
    replaces: Option<usize>,
}

fn question(
    tokenizer: &dyn TextTokenizer,
    config: &DataConfig,
    p: &Patterns,
    filler_name: &str,
    haystack: &Haystack,
    rng: &mut StdRng,
) -> Result<Trajectory> {
    let n_chunks = rng.random_range(1..=4usize);
    let kind = *p.kinds.choose(rng).expect("kinds");
    let family = *QUESTION_FAMILIES.choose(rng).expect("families");
    let mut pl = Planting {
        p,
        kind,
        n_chunks,
        plants: Vec::new(),
    };
    let (question, expected): (String, Vec<String>) = match family {
        "single" | "multikey" => pl.one_key(family, rng),
        "multivalue" => pl.values_of_one_key(rng),
        "multiquery" => pl.several_keys(rng),
        "update" => pl.updated_value(rng),
        "multihop" => pl.two_hops(rng),
        _ => pl.variables(rng),
    };
    let plants = pl.plants;
    let (steps, memory_lines) =
        question_steps(tokenizer, config, haystack, &plants, n_chunks, rng)?;
    let answer = format!("The answer is \\boxed{{{}}}.", expected.join(", "));
    check_memory(tokenizer, config, &steps)?;
    Ok(Trajectory {
        mode: Mode::Question,
        family,
        filler: filler_name.to_string(),
        question,
        steps,
        answer,
        expected,
        memory_lines,
        fact_values: Vec::new(),
    })
}

/// The chunks of a question trajectory: filler with each chunk's plants at random depths
/// (in plant order), and the memory after each; with the memory's lines at the end.
fn question_steps(
    tokenizer: &dyn TextTokenizer,
    config: &DataConfig,
    haystack: &Haystack,
    plants: &[Plant],
    n_chunks: usize,
    rng: &mut StdRng,
) -> Result<(Vec<Step>, Vec<String>)> {
    let mut steps = Vec::with_capacity(n_chunks);
    let mut memory_lines: Vec<(usize, String)> = Vec::new();
    let mut memory = NO_MEMORY.to_string();
    for c in 0..n_chunks {
        let size = rng.random_range(config.chunk_min..=config.chunk_max);
        let here: Vec<usize> = (0..plants.len())
            .filter(|&i| plants[i].chunk == c)
            .collect();
        let mut depths: Vec<f64> = here.iter().map(|_| rng.random_range(0.0..1.0)).collect();
        depths.sort_by(f64::total_cmp);
        let inserts: Vec<(f64, String)> = depths
            .into_iter()
            .zip(here.iter().map(|&i| plants[i].text.clone()))
            .collect();
        let start = rng.random_range(0..haystack.word_count());
        let (chunk, _) = compose(haystack, tokenizer, size, start, &inserts)?;
        for &i in &here {
            if plants[i].relevant {
                // An updated value replaces the line it supersedes.
                memory_lines.retain(|(j, _)| plants[*j].replaces.map(|r| j + r) != Some(i));
                memory_lines.push((i, plants[i].text.clone()));
            }
        }
        let after = if memory_lines.is_empty() {
            NOTHING_YET.to_string()
        } else {
            memory_lines
                .iter()
                .map(|(_, l)| l.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        };
        steps.push(Step {
            chunk,
            memory_before: std::mem::replace(&mut memory, after.clone()),
            memory_after: after,
            relevant: here
                .iter()
                .filter(|&&i| plants[i].relevant)
                .map(|&i| plants[i].text.clone())
                .collect(),
            distractors: here
                .iter()
                .filter(|&&i| !plants[i].relevant)
                .map(|&i| plants[i].text.clone())
                .collect(),
            values: Vec::new(),
        });
    }
    Ok((steps, memory_lines.into_iter().map(|(_, l)| l).collect()))
}

/// A question trajectory's facts as they are planted: the patterns, the kind of value,
/// the chunk count, and the plants so far.
struct Planting<'a> {
    p: &'a Patterns,
    kind: &'a str,
    n_chunks: usize,
    plants: Vec<Plant>,
}

impl Planting<'_> {
    /// A chunk at random.
    fn at(&self, rng: &mut StdRng) -> usize {
        rng.random_range(0..self.n_chunks)
    }

    fn fact(&self, key: &str, value: &str, rng: &mut StdRng) -> String {
        fill(
            self.p.facts.choose(rng).expect("facts"),
            &[("kind", self.kind), ("key", key), ("value", value)],
        )
    }

    fn plant(&mut self, text: String, chunk: usize, relevant: bool) {
        self.plants.push(Plant {
            text,
            chunk,
            relevant,
            replaces: None,
        });
    }

    /// A relevant fact of `key` in a random chunk.
    fn relevant(&mut self, key: &str, value: &str, rng: &mut StdRng) {
        let text = self.fact(key, value, rng);
        let chunk = self.at(rng);
        self.plant(text, chunk, true);
    }

    /// A fact of each of `keys` with a random value, in random chunks.
    fn distract(&mut self, keys: &[&str], rng: &mut StdRng) {
        for key in keys {
            let v = value_of(self.kind, rng);
            let text = self.fact(key, &v, rng);
            let chunk = rng.random_range(0..self.n_chunks);
            self.plant(text, chunk, false);
        }
    }

    /// One key's value among others' (`single`: at most one other, `multikey`: one to
    /// three).
    fn one_key(&mut self, family: &str, rng: &mut StdRng) -> (String, Vec<String>) {
        let keys = picks(self.p.keys, 4, rng);
        let value = value_of(self.kind, rng);
        self.relevant(keys[0], &value, rng);
        let n_distract = if family == "single" {
            rng.random_range(0..=1)
        } else {
            rng.random_range(1..=3)
        };
        self.distract(&keys[1..=n_distract], rng);
        (
            fill(
                self.p.ask_one.choose(rng).expect("q"),
                &[("kind", self.kind), ("key", keys[0])],
            ),
            vec![value],
        )
    }

    /// Every value of one key (two to four).
    fn values_of_one_key(&mut self, rng: &mut StdRng) -> (String, Vec<String>) {
        let keys = picks(self.p.keys, 3, rng);
        let n = rng.random_range(2..=4);
        let mut values = Vec::new();
        while values.len() < n {
            let v = value_of(self.kind, rng);
            if !values.contains(&v) {
                values.push(v);
            }
        }
        for v in &values {
            self.relevant(keys[0], v, rng);
        }
        let nd = rng.random_range(0..=2);
        self.distract(&keys[1..=nd], rng);
        (
            fill(
                self.p.ask_all.choose(rng).expect("q"),
                &[("kind", self.kind), ("key", keys[0])],
            ),
            values,
        )
    }

    /// The values of several keys (two to four).
    fn several_keys(&mut self, rng: &mut StdRng) -> (String, Vec<String>) {
        let n = rng.random_range(2..=4);
        let keys = picks(self.p.keys, n + 1, rng);
        let mut values = Vec::new();
        for key in &keys[..n] {
            let v = value_of(self.kind, rng);
            self.relevant(key, &v, rng);
            values.push(v);
        }
        if rng.random_bool(0.5) {
            self.distract(&keys[n..], rng);
        }
        let list = match n {
            2 => format!("{} and {}", keys[0], keys[1]),
            _ => format!("{} and {}", keys[..n - 1].join(", "), keys[n - 1]),
        };
        (
            fill(
                self.p.ask_many.choose(rng).expect("q"),
                &[("kind", self.kind), ("keys", &list)],
            ),
            values,
        )
    }

    /// A value said, then changed in the same or a later chunk: the new one is asked.
    fn updated_value(&mut self, rng: &mut StdRng) -> (String, Vec<String>) {
        let keys = picks(self.p.keys, 3, rng);
        let (old, new) = (value_of(self.kind, rng), value_of(self.kind, rng));
        let first = rng.random_range(0..self.n_chunks);
        let later = rng.random_range(first..self.n_chunks);
        let text = self.fact(keys[0], &old, rng);
        self.plants.push(Plant {
            text,
            chunk: first,
            relevant: true,
            replaces: Some(1),
        });
        let change = fill(
            self.p.changes.choose(rng).expect("c"),
            &[("kind", self.kind), ("key", keys[0]), ("value", &new)],
        );
        self.plant(change, later, true);
        let nd = rng.random_range(0..=2);
        self.distract(&keys[1..=nd], rng);
        (
            fill(
                self.p.ask_one.choose(rng).expect("q"),
                &[("kind", self.kind), ("key", keys[0])],
            ),
            vec![new],
        )
    }

    /// Where someone's relative lives: a relation and a home, sometimes beside another
    /// pair.
    fn two_hops(&mut self, rng: &mut StdRng) -> (String, Vec<String>) {
        let p = self.p;
        let people = picks(p.people, 4, rng);
        let places = picks(p.places, 2, rng);
        let rel = *RELATIONS.choose(rng).expect("rel");
        let link = |a: &str, b: &str, rng: &mut StdRng| {
            fill(
                p.relation.choose(rng).expect("r"),
                &[("a", a), ("b", b), ("rel", rel)],
            )
        };
        let home = |b: &str, place: &str, rng: &mut StdRng| {
            fill(
                p.lives.choose(rng).expect("l"),
                &[("b", b), ("place", place)],
            )
        };
        // people[0] is the rel of people[1]; people[0] lives in places[0].
        let l1 = link(people[0], people[1], rng);
        let l2 = home(people[0], places[0], rng);
        let chunk = self.at(rng);
        self.plant(l1, chunk, true);
        let chunk = self.at(rng);
        self.plant(l2, chunk, true);
        if rng.random_bool(0.7) {
            let d1 = link(people[2], people[3], rng);
            let d2 = home(people[2], places[1], rng);
            let chunk = self.at(rng);
            self.plant(d1, chunk, false);
            let chunk = self.at(rng);
            self.plant(d2, chunk, false);
        }
        (
            fill(
                p.ask_hop.choose(rng).expect("q"),
                &[("rel", rel), ("b2", people[1])],
            ),
            vec![places[0].to_string()],
        )
    }

    /// Variable tracking: a value assigned, then copied from name to name.
    fn variables(&mut self, rng: &mut StdRng) -> (String, Vec<String>) {
        let names: Vec<String> = {
            let mut set = BTreeSet::new();
            let mut v = Vec::new();
            while v.len() < 6 {
                let n: String = (0..5)
                    .map(|_| (b'A' + rng.random_range(0..26u8)) as char)
                    .collect();
                if set.insert(n.clone()) {
                    v.push(n);
                }
            }
            v
        };
        let n_chunks = self.n_chunks;
        let len = rng.random_range(2..=4);
        let value = rng.random_range(10_000u32..100_000).to_string();
        let (a, c) = (
            *self.p.assign.choose(rng).expect("a"),
            *self.p.copy.choose(rng).expect("c"),
        );
        let mut chunks: Vec<usize> = (0..len).map(|_| rng.random_range(0..n_chunks)).collect();
        chunks.sort();
        self.plant(
            fill(a, &[("x", &names[0]), ("value", &value)]),
            chunks[0],
            true,
        );
        for i in 1..len {
            self.plant(
                fill(c, &[("y", &names[i]), ("x", &names[i - 1])]),
                chunks[i],
                true,
            );
        }
        if rng.random_bool(0.6) {
            let other = rng.random_range(10_000u32..100_000).to_string();
            let text = fill(a, &[("x", &names[4]), ("value", &other)]);
            let chunk = rng.random_range(0..n_chunks);
            self.plant(text, chunk, false);
            self.plant(
                fill(c, &[("y", &names[5]), ("x", &names[4])]),
                n_chunks - 1,
                false,
            );
        }
        let expected = names[..len].to_vec();
        (
            fill(
                self.p.ask_vars.choose(rng).expect("q"),
                &[("value", &value)],
            ),
            expected,
        )
    }
}

fn check_memory(tokenizer: &dyn TextTokenizer, config: &DataConfig, steps: &[Step]) -> Result<()> {
    for (i, s) in steps.iter().enumerate() {
        let n = tokenizer.encode(&s.memory_after)?.len();
        if n > config.memory_tokens {
            return Err(Error::InvalidRequest(format!(
                "oracle memory of step {} has {n} tokens, over the cap of {}",
                i + 1,
                config.memory_tokens
            )));
        }
    }
    Ok(())
}

/// One durable fact of a general-mode trajectory.
struct Said {
    said: String,
    /// The fact as said, without a flag ("Please remember this: ") in front.
    plain: String,
    remembered: String,
    question: String,
    /// The values the remembered line states.
    values: Vec<String>,
    /// Facts with the same slot replace each other (the newest wins).
    slot: String,
}

/// The first three words of a remembered fact: facts about one thing share them.
fn slot_of(remembered: &str) -> String {
    remembered.split(' ').take(3).collect::<Vec<_>>().join(" ")
}

/// A fact as the listener repeats it back: "my sister" becomes "your sister".
fn echo(said: &str) -> String {
    let said = said.replacen("I was ", "you were ", 1);
    let mut out: Vec<String> = Vec::new();
    for word in said.split(' ') {
        let end = word.trim_end_matches(|c: char| !c.is_alphanumeric() && c != '\'');
        let tail = &word[end.len()..];
        let swapped = match end {
            "I" => "you",
            "I'm" => "you're",
            "I've" => "you've",
            "I'll" => "you'll",
            "my" | "My" | "our" | "Our" => "your",
            "we" | "We" => "you",
            "me" => "you",
            "am" => "are",
            w => w,
        };
        out.push(format!("{swapped}{tail}"));
    }
    out.join(" ")
}

/// One sentence drawn from fragment lists.
fn sentence(parts: &[&[&str]], rng: &mut StdRng) -> String {
    parts
        .iter()
        .map(|part| *part.choose(rng).expect("fragments"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// How a trajectory writes its turns, as the daemon renders conversation logs.
#[derive(Clone, Copy)]
enum TurnStyle {
    /// Dated notes, one per line.
    Notes,
    /// `[date time] who: text` on every turn.
    Stamped,
    /// `who: text`, with a timestamp now and then (where a message carries one).
    Plain,
}

/// Writes the turns of one trajectory, advancing its clock.
struct TurnWriter {
    style: TurnStyle,
    day: u32,
    minute: u32,
    speaker: String,
    other: String,
}

impl TurnWriter {
    fn line(&mut self, text: &str, by_speaker: bool, rng: &mut StdRng) -> String {
        self.minute += rng.random_range(1..40);
        if self.minute >= 24 * 60 {
            self.minute -= 24 * 60;
            self.day += 1;
        }
        let stamp = format!(
            "[2026-{:02}-{:02} {:02}:{:02}]",
            3 + self.day / 28,
            self.day % 28 + 1,
            self.minute / 60,
            self.minute % 60
        );
        let who = if by_speaker {
            &self.speaker
        } else {
            &self.other
        };
        match self.style {
            TurnStyle::Notes => format!("- {text}"),
            TurnStyle::Stamped => format!("{stamp} {who}: {text}"),
            TurnStyle::Plain if rng.random_bool(0.1) => format!("{stamp} {who}: {text}"),
            TurnStyle::Plain => format!("{who}: {text}"),
        }
    }
}

fn general(
    tokenizer: &dyn TextTokenizer,
    config: &DataConfig,
    p: &Patterns,
    rng: &mut StdRng,
) -> Result<Trajectory> {
    let people = ChatPeople::draw(p, rng);
    let n_facts = rng.random_range(1..=6usize);
    let mut facts: Vec<Said> = Vec::new();
    let mut used = BTreeSet::new();
    for _ in 0..n_facts {
        let pattern = *p.chat.choose(rng).expect("chat");
        facts.extend(people.said(p, pattern, true, &mut used, rng));
    }
    // Sometimes a later update replaces a fact of the same slot.
    if rng.random_bool(0.3) {
        let pattern = *p.chat_updates.choose(rng).expect("updates");
        facts.extend(people.said(p, pattern, false, &mut BTreeSet::new(), rng));
    }
    // Turns: small talk with the facts said by the speaker at random places.
    let n_chunks = rng.random_range(1..=3usize);
    let sizes: Vec<usize> = (0..n_chunks)
        .map(|_| rng.random_range(config.chunk_min..=config.chunk_max))
        .collect();
    let style = if !people.two && rng.random_bool(0.25) {
        TurnStyle::Notes
    } else if rng.random_bool(0.5) {
        TurnStyle::Stamped
    } else {
        TurnStyle::Plain
    };
    let family = match (style, people.two) {
        (TurnStyle::Notes, _) => "notes",
        (_, true) => "two-people",
        (_, false) => "chat",
    };
    let mut writer = TurnWriter {
        style,
        day: rng.random_range(1..=20u32),
        minute: rng.random_range(0..600u32),
        speaker: match &people.user_name {
            Some(n) => format!("{} ({n})", people.speaker),
            None => people.speaker.clone(),
        },
        other: people.other.clone(),
    };
    let total: usize = sizes.iter().sum();
    let chat = Chat {
        tokenizer,
        p,
        facts: &facts,
        style,
    };
    let lines = chat.lines(&mut writer, total, rng)?;
    let (steps, memory) = chat.chunks(lines, &sizes)?;
    check_memory(tokenizer, config, &steps)?;
    // Ask about a remembered fact, or (sometimes) about something never said.
    let (question, answer, expected) = if memory.is_empty() || rng.random_bool(0.15) {
        let q = people.subject("What is the user's shoe size?");
        (q, "not known".to_string(), vec!["not known".to_string()])
    } else {
        let f = &facts[*memory.choose(rng).expect("memory")];
        (f.question.clone(), f.remembered.clone(), f.values.clone())
    };
    Ok(Trajectory {
        mode: Mode::General,
        family,
        filler: if matches!(style, TurnStyle::Notes) {
            "notes".into()
        } else {
            "small-talk turns".into()
        },
        question,
        steps,
        answer,
        expected,
        memory_lines: memory
            .iter()
            .map(|&i| facts[i].remembered.clone())
            .collect(),
        fact_values: memory.iter().map(|&i| facts[i].values.clone()).collect(),
    })
}

/// Who talks in a general-mode chat: the user and the assistant, or two people (the
/// first says the facts); in a chat the user's messages may carry a display name
/// ("user (Nadia): …").
struct ChatPeople {
    two: bool,
    speaker: String,
    other: String,
    user_name: Option<String>,
}

impl ChatPeople {
    fn draw(p: &Patterns, rng: &mut StdRng) -> Self {
        let two = rng.random_bool(0.35);
        let (speaker, other) = if two {
            let ps = picks(p.people, 2, rng);
            (ps[0].to_string(), ps[1].to_string())
        } else {
            ("user".to_string(), "assistant".to_string())
        };
        let user_name = (!two && rng.random_bool(0.3))
            .then(|| p.people.choose(rng).expect("people").to_string());
        Self {
            two,
            speaker,
            other,
            user_name,
        }
    }

    /// `s` about the speaker: "the user" is the speaker's name when two people talk.
    fn subject(&self, s: &str) -> String {
        if self.two {
            let speaker = &self.speaker;
            s.replace("The user's", &format!("{speaker}'s"))
                .replace("The user", speaker)
                .replace("the user's", &format!("{speaker}'s"))
                .replace("the user", speaker)
        } else {
            s.to_string()
        }
    }

    /// A fact the speaker says (`said`), as memory keeps it (`rem`) and as it is asked
    /// (`q`), its slots filled at random; `None` when its slot was `used` already.
    /// `flag`: sometimes said with a reminder in front ("Please remember this: ").
    fn said(
        &self,
        p: &Patterns,
        (said, rem, q): (&str, &str, &str),
        flag: bool,
        used: &mut BTreeSet<String>,
        rng: &mut StdRng,
    ) -> Option<Said> {
        let names = picks(p.people, 2, rng);
        let name = if self.two {
            self.speaker.clone()
        } else {
            self.user_name
                .clone()
                .unwrap_or_else(|| names[0].to_string())
        };
        // Drawn in this order: relation, date, place, food, job, item, pet.
        let rel = RELATIONS.choose(rng).expect("r");
        let date = format!(
            "{} {}",
            MONTHS.choose(rng).expect("m"),
            rng.random_range(1..=28)
        );
        let pairs = [
            ("name", name.as_str()),
            ("name2", names[1]),
            ("rel", rel),
            ("date", &date),
            ("place", p.places.choose(rng).expect("p")),
            ("food", FOODS.choose(rng).expect("f")),
            ("job", JOBS.choose(rng).expect("j")),
            ("item", ITEMS.choose(rng).expect("i")),
            ("pet", PETS.choose(rng).expect("p")),
        ];
        let remembered = fill(rem, &pairs);
        let slot = slot_of(&remembered);
        if !used.insert(slot.clone()) {
            return None;
        }
        let values = pairs
            .iter()
            .filter(|(k, _)| rem.contains(&format!("{{{k}}}")))
            .map(|(_, v)| v.to_string())
            .collect();
        let mut plain = fill(said, &pairs);
        let mut said_text = plain.clone();
        if flag && rng.random_bool(0.3) {
            let remind = p.remind.choose(rng).expect("remind");
            // "Please remember this: my sister …", but "…: I live …" and "…: Lucia, …".
            let first = said.split(' ').next().unwrap_or_default();
            if !said.starts_with('{') && !["I", "I'm", "I've"].contains(&first) {
                plain.replace_range(..1, &plain[..1].to_lowercase());
            }
            said_text = format!("{remind}{plain}");
        }
        Some(Said {
            said: said_text,
            plain,
            remembered: self.subject(&remembered),
            question: self.subject(&fill(q, &pairs)),
            values,
            slot,
        })
    }
}

/// A general-mode chat being written: its facts, said in turns of `style`.
struct Chat<'a> {
    tokenizer: &'a dyn TextTokenizer,
    p: &'a Patterns,
    facts: &'a [Said],
    style: TurnStyle,
}

impl Chat<'_> {
    /// About `total` tokens of turns: small talk, with each fact said at a random place
    /// (in order); each line with the fact it says.
    fn lines(
        &self,
        writer: &mut TurnWriter,
        total: usize,
        rng: &mut StdRng,
    ) -> Result<Vec<(String, Option<usize>)>> {
        let p = self.p;
        // Where each fact falls, as a fraction of the whole text.
        let mut at: Vec<f64> = self
            .facts
            .iter()
            .map(|_| rng.random_range(0.0..1.0))
            .collect();
        at.sort_by(f64::total_cmp);
        let mut lines: Vec<(String, Option<usize>)> = Vec::new();
        let mut tokens = 0;
        let mut next = 0;
        while tokens < total {
            while next < self.facts.len() && at[next] * total as f64 <= tokens as f64 {
                tokens += self.say(next, writer, &mut lines, rng)?;
                next += 1;
            }
            let small_talk = if rng.random_bool(0.5) {
                p.openers.choose(rng).expect("o").to_string()
            } else {
                sentence(p.passing.choose(rng).expect("passing"), rng)
            };
            let l = writer.line(&small_talk, rng.random_bool(0.5), rng);
            tokens += self.tokenizer.encode(&l)?.len() + 1;
            lines.push((l, None));
        }
        while next < self.facts.len() {
            self.say(next, writer, &mut lines, rng)?;
            next += 1;
        }
        Ok(lines)
    }

    /// Fact `i` said, and often acknowledged (sometimes repeated back) by the listener:
    /// the tokens of the lines added.
    fn say(
        &self,
        i: usize,
        writer: &mut TurnWriter,
        lines: &mut Vec<(String, Option<usize>)>,
        rng: &mut StdRng,
    ) -> Result<usize> {
        let mut said = vec![(writer.line(&self.facts[i].said, true, rng), Some(i))];
        if !matches!(self.style, TurnStyle::Notes) && rng.random_bool(0.5) {
            let text = fill(
                self.p.acks.choose(rng).expect("acks"),
                &[("echo", &echo(&self.facts[i].plain))],
            );
            said.push((writer.line(&text, false, rng), None));
        }
        let mut n = 0;
        for (l, f) in said {
            n += self.tokenizer.encode(&l)?.len() + 1;
            lines.push((l, f));
        }
        Ok(n)
    }

    /// The lines cut into chunks at `sizes` (by running token count), each with the
    /// memory before and after it; and the facts remembered at the end.
    fn chunks(
        &self,
        lines: Vec<(String, Option<usize>)>,
        sizes: &[usize],
    ) -> Result<(Vec<Step>, Vec<usize>)> {
        let mut steps = Vec::new();
        let mut current: Vec<(String, Option<usize>)> = Vec::new();
        let mut current_tokens = 0;
        let mut memory: Vec<usize> = Vec::new();
        let mut before = NO_MEMORY.to_string();
        let mut size_i = 0;
        for (l, f) in lines {
            current_tokens += self.tokenizer.encode(&l)?.len() + 1;
            current.push((l, f));
            if current_tokens >= sizes[size_i.min(sizes.len() - 1)] {
                steps.push(self.step(&mut current, &mut memory, &mut before));
                current_tokens = 0;
                size_i += 1;
            }
        }
        if !current.is_empty() {
            steps.push(self.step(&mut current, &mut memory, &mut before));
        }
        Ok((steps, memory))
    }

    /// The chunk of the `current` lines, the memory it leaves (a fact replaces one of
    /// its slot), and what it says.
    fn step(
        &self,
        current: &mut Vec<(String, Option<usize>)>,
        memory: &mut Vec<usize>,
        before: &mut String,
    ) -> Step {
        let facts = self.facts;
        let (mut relevant, mut values) = (Vec::new(), Vec::new());
        for (_, f) in current.iter() {
            if let Some(i) = *f {
                memory.retain(|&j| facts[j].slot != facts[i].slot);
                memory.push(i);
                relevant.push(facts[i].said.clone());
                values.push(facts[i].values.clone());
            }
        }
        let after = if memory.is_empty() {
            NO_FACTS.to_string()
        } else {
            memory
                .iter()
                .map(|&i| facts[i].remembered.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        };
        let chunk = current
            .iter()
            .map(|(l, _)| l.as_str())
            .collect::<Vec<_>>()
            .join("\n");
        let step = Step {
            chunk,
            memory_before: std::mem::replace(before, after.clone()),
            memory_after: after,
            relevant,
            distractors: Vec::new(),
            values,
        };
        current.clear();
        step
    }
}

/// Every surface pattern of a split (for checking that validation's are unseen).
pub fn patterns(split: Split) -> Vec<&'static str> {
    let p = Patterns::of(split);
    let mut v: Vec<&str> = Vec::new();
    for list in [
        p.facts, p.ask_one, p.ask_all, p.ask_many, p.changes, p.relation, p.lives, p.ask_hop,
        p.assign, p.copy, p.ask_vars, p.openers, p.remind, p.acks,
    ] {
        v.extend_from_slice(list);
    }
    for list in [p.chat, p.chat_updates] {
        v.extend(list.iter().flat_map(|(a, _, c)| [*a, *c]));
    }
    v
}

/// The keys of a split's facts.
pub fn keys(split: Split) -> &'static [&'static str] {
    Patterns::of(split).keys
}
