//! Multi-session chats with known answers: facts stated once and asked many sessions
//! later, facts changed in a later session (the answer is the newest value), and
//! questions about things never said (the answer must say it is not known).
//!
//! Two splits that share no sentence pattern, small talk, names or seeds: `validation`,
//! on which prompts and settings may be chosen, and `test`, which is only reported.

use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::split::EvalSplit;
use crate::training::MONTHS;

/// What a question asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuestionKind {
    /// A fact said once, sessions earlier.
    Stated,
    /// A fact said, then changed in a later session: the newest value is the answer.
    Changed,
    /// Never said: the answer must say it is not known.
    Unknown,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
    /// `YYYY-MM-DD HH:MM`, on each session's first message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionQuestion {
    pub kind: QuestionKind,
    pub question: String,
    /// The value the answer must hold (none for `unknown`).
    pub expected: Option<String>,
    /// An earlier value the answer must not give (`changed` only).
    pub stale: Option<String>,
}

/// A chat of several sessions and the questions asked after it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionSample {
    pub seed: u64,
    pub split: EvalSplit,
    pub messages: Vec<Message>,
    pub questions: Vec<SessionQuestion>,
}

/// The surface forms of one split.
struct Forms {
    names: &'static [&'static str],
    relations: &'static [&'static str],
    places: &'static [&'static str],
    small_talk: &'static [&'static str],
    /// (statement, change, question) per attribute; `{n}` name, `{r}` relation, `{v}`
    /// value, `{p}` place.
    lives: [&'static str; 3],
    job: [&'static str; 3],
    pet: [&'static str; 3],
    wifi: [&'static str; 3],
    birthday: [&'static str; 2],
}

const VALIDATION: Forms = Forms {
    names: &[
        "Ingrid", "Tomas", "Mireille", "Kofi", "Annika", "Ravi", "Solveig", "Dario",
    ],
    relations: &["sister", "cousin", "neighbour", "colleague"],
    places: &["the cabin", "the studio", "grandma's flat"],
    small_talk: &[
        "The weather looks grey again today.",
        "I watched a documentary about whales last night.",
        "Can you suggest a quick lunch idea?",
        "My train was late again this morning.",
        "I finally fixed the squeaky door in the hallway.",
        "We are thinking about repainting the kitchen.",
        "The bakery downstairs had fresh pretzels today.",
        "I should really go to bed earlier.",
    ],
    lives: [
        "My {r} {n} lives in {v}.",
        "{n} moved to {v} last month.",
        "Where does my {r} {n} live?",
    ],
    job: [
        "My {r} {n} works as a {v}.",
        "{n} quit and now works as a {v}.",
        "What does my {r} {n} do for work?",
    ],
    pet: [
        "My {r} {n} has a dog called {v}.",
        "{n}'s old dog passed away; the new puppy is called {v}.",
        "What is the name of {n}'s dog?",
    ],
    wifi: [
        "The wifi password at {p} is {v}.",
        "We changed the wifi password at {p} to {v}.",
        "What is the wifi password at {p}?",
    ],
    birthday: [
        "My {r} {n}'s birthday is on {v}.",
        "When is {n}'s birthday?",
    ],
};

const TEST: Forms = Forms {
    names: &[
        "Lucia", "Henrik", "Amara", "Joaquin", "Priya", "Olek", "Fenna", "Matteo",
    ],
    relations: &["brother", "aunt", "landlord", "best friend"],
    places: &["the lake house", "the office", "my parents' place"],
    small_talk: &[
        "It rained all afternoon, so I stayed in and read.",
        "Do you know a good stretch for a stiff neck?",
        "The neighbours are painting their fence blue.",
        "I tried a new coffee place near the station.",
        "My phone battery dies so quickly lately.",
        "We had pancakes for breakfast this morning.",
        "The bus driver today was really friendly.",
        "I need to remember to water the plants.",
    ],
    lives: [
        "{n}, my {r}, has a flat in {v}.",
        "{n} just relocated to {v}.",
        "In which city does {n} live?",
    ],
    job: [
        "{n} (my {r}) is employed as a {v}.",
        "{n} changed careers and is now a {v}.",
        "What is {n}'s job?",
    ],
    pet: [
        "{n}, my {r}, adopted a dog named {v}.",
        "{n} renamed the dog; it answers to {v} now.",
        "What is {n}'s dog called?",
    ],
    wifi: [
        "For the record, {p} wifi key: {v}.",
        "New wifi key for {p}: {v}.",
        "What is the wifi key for {p}?",
    ],
    birthday: [
        "{n}'s birthday, my {r}, falls on {v}.",
        "On what date is {n}'s birthday?",
    ],
};

const CITIES: &[&str] = &[
    "Porto", "Tallinn", "Ghent", "Bergen", "Lyon", "Krakow", "Valencia", "Graz", "Aarhus",
    "Bologna",
];
const JOBS: &[&str] = &[
    "nurse",
    "carpenter",
    "pilot",
    "librarian",
    "chef",
    "translator",
    "geologist",
    "dentist",
];
const PETS: &[&str] = &[
    "Biscuit", "Pepper", "Nimbus", "Waffles", "Juniper", "Rocket", "Mochi",
];
const ASSISTANT_REPLIES: &[&str] = &[
    "Noted.",
    "Thanks for telling me.",
    "Got it, I'll remember that.",
    "That sounds nice.",
    "I understand.",
];

fn forms(split: EvalSplit) -> &'static Forms {
    match split {
        EvalSplit::Validation => &VALIDATION,
        EvalSplit::Test => &TEST,
    }
}

fn fill(form: &str, name: &str, relation: &str, value: &str, place: &str) -> String {
    form.replace("{n}", name)
        .replace("{r}", relation)
        .replace("{v}", value)
        .replace("{p}", place)
}

/// A planted fact: its statement, and its change when it has one.
struct Fact {
    statement: String,
    change: Option<String>,
    question: String,
    value: String,
    new_value: Option<String>,
}

fn code(rng: &mut StdRng) -> String {
    const WORDS: &[&str] = &[
        "pine", "otter", "maple", "cobalt", "harbor", "ember", "willow",
    ];
    format!(
        "{}{}",
        WORDS.choose(rng).expect("words"),
        rng.random_range(10..100)
    )
}

/// The chat of `seed` in `split`: `sessions` sessions (at least 4), each a day or more
/// apart with small talk; facts said in the first half, some changed in the second half.
pub fn session_chat(seed: u64, split: EvalSplit, sessions: usize) -> SessionSample {
    let salt = match split {
        EvalSplit::Validation => 0x5E55_1011_u64,
        EvalSplit::Test => 0x7E57_2022_u64 << 16,
    };
    let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt);
    let f = forms(split);
    let sessions = sessions.max(4);
    let mut names: Vec<&str> = f.names.to_vec();
    names.shuffle(&mut rng);
    let place = pick(&mut rng, f.places);
    let facts = session_facts(f, &names, &place, &mut rng);
    let messages = session_messages(f, &facts, sessions, &mut rng);
    let mut questions: Vec<SessionQuestion> = facts
        .iter()
        .map(|fact| match &fact.new_value {
            Some(nv) => SessionQuestion {
                kind: QuestionKind::Changed,
                question: fact.question.clone(),
                expected: Some(nv.clone()),
                stale: Some(fact.value.clone()),
            },
            None => SessionQuestion {
                kind: QuestionKind::Stated,
                question: fact.question.clone(),
                expected: Some(fact.value.clone()),
                stale: None,
            },
        })
        .collect();
    // Never said: the same questions about people who never came up.
    for (i, form) in [f.lives[2], f.job[2]].iter().enumerate() {
        let n = names[ATTRIBUTES.len() + i];
        questions.push(SessionQuestion {
            kind: QuestionKind::Unknown,
            question: fill(form, n, relation(f, &mut rng), "", &place),
            expected: None,
            stale: None,
        });
    }
    SessionSample {
        seed,
        split,
        messages,
        questions,
    }
}

/// What each chat says of its people, in this order; two of them change later.
const ATTRIBUTES: [&str; 5] = ["lives", "job", "pet", "wifi", "birthday"];

fn relation(f: &Forms, rng: &mut StdRng) -> &'static str {
    f.relations.choose(rng).expect("relations")
}

fn pick(rng: &mut StdRng, list: &[&str]) -> String {
    list.choose(rng).expect("values").to_string()
}

/// A value of `list` other than `not`.
fn other(rng: &mut StdRng, list: &[&str], not: &str) -> String {
    loop {
        let v = pick(rng, list);
        if v != not {
            break v;
        }
    }
}

/// A fact of each attribute, about the first names in order; every other one (but the
/// birthday) changes later.
fn session_facts(f: &Forms, names: &[&str], place: &str, rng: &mut StdRng) -> Vec<Fact> {
    let mut facts = Vec::new();
    for (i, attribute) in ATTRIBUTES.iter().enumerate() {
        let (n, r) = (names[i], relation(f, rng));
        let (forms, values): (&[&str], &[&str]) = match *attribute {
            "lives" => (&f.lives, CITIES),
            "job" => (&f.job, JOBS),
            "pet" => (&f.pet, PETS),
            _ => (&f.wifi, &[]),
        };
        let fact = match *attribute {
            "birthday" => {
                let v = format!(
                    "{} {}",
                    MONTHS.choose(rng).expect("months"),
                    rng.random_range(1..29)
                );
                Fact {
                    statement: fill(f.birthday[0], n, r, &v, place),
                    change: None,
                    question: fill(f.birthday[1], n, r, &v, place),
                    value: v,
                    new_value: None,
                }
            }
            _ => {
                let v = match *attribute {
                    "wifi" => code(rng),
                    _ => pick(rng, values),
                };
                let changes = i % 2 == 0;
                let new_value = changes.then(|| match *attribute {
                    "wifi" => code(rng),
                    _ => other(rng, values, &v),
                });
                Fact {
                    statement: fill(forms[0], n, r, &v, place),
                    change: new_value.as_ref().map(|nv| fill(forms[1], n, r, nv, place)),
                    question: fill(forms[2], n, r, &v, place),
                    value: v,
                    new_value,
                }
            }
        };
        facts.push(fact);
    }
    facts
}

/// The chat's messages: facts said in the first half of the sessions, changes in the
/// second, small talk around them; each session's first message dated.
fn session_messages(f: &Forms, facts: &[Fact], sessions: usize, rng: &mut StdRng) -> Vec<Message> {
    let half = sessions / 2;
    let mut plan: Vec<Vec<String>> = vec![Vec::new(); sessions];
    for fact in facts {
        plan[rng.random_range(0..half)].push(fact.statement.clone());
        if let Some(change) = &fact.change {
            plan[rng.random_range(half..sessions)].push(change.clone());
        }
    }
    let mut messages = Vec::new();
    for (s, said) in plan.iter_mut().enumerate() {
        let mut lines: Vec<String> = (0..rng.random_range(6..10))
            .map(|_| pick(rng, f.small_talk))
            .collect();
        for fact in said.drain(..) {
            let at = rng.random_range(0..=lines.len());
            lines.insert(at, fact);
        }
        for (i, line) in lines.into_iter().enumerate() {
            messages.push(Message {
                role: "user".into(),
                content: line,
                timestamp: (i == 0).then(|| {
                    format!(
                        "2026-{:02}-{:02} {:02}:{:02}",
                        1 + s / 4,
                        1 + (s % 4) * 7,
                        9 + s % 8,
                        15
                    )
                }),
            });
            messages.push(Message {
                role: "assistant".into(),
                content: pick(rng, ASSISTANT_REPLIES),
                timestamp: None,
            });
        }
    }
    messages
}

/// Whether `answer` is right: it holds the expected value (and not the stale one), or,
/// for a question never answered in the chat, says it is not known.
pub fn session_correct(question: &SessionQuestion, answer: &str) -> bool {
    let a = answer.to_lowercase();
    match question.kind {
        QuestionKind::Unknown => [
            "not known",
            "unknown",
            "don't know",
            "do not know",
            "not mentioned",
            "no information",
            "not say",
        ]
        .iter()
        .any(|m| a.contains(m)),
        _ => {
            let expected = question
                .expected
                .as_deref()
                .unwrap_or_default()
                .to_lowercase();
            let stale = question.stale.as_deref().map(str::to_lowercase);
            a.contains(&expected) && stale.is_none_or(|s| !a.contains(&s))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chats_are_deterministic_and_the_splits_share_no_pattern() {
        let a = session_chat(3, EvalSplit::Test, 6);
        assert_eq!(a, session_chat(3, EvalSplit::Test, 6));
        let v = session_chat(3, EvalSplit::Validation, 6);
        let text = |s: &SessionSample| {
            s.messages
                .iter()
                .map(|m| m.content.clone())
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert_ne!(text(&a), text(&v));
        for q in &a.questions {
            assert!(
                !VALIDATION.names.iter().any(|n| q.question.contains(n)),
                "{q:?}"
            );
        }
        let kinds: Vec<_> = a.questions.iter().map(|q| q.kind).collect();
        assert_eq!(
            kinds
                .iter()
                .filter(|k| **k == QuestionKind::Changed)
                .count(),
            2
        );
        assert_eq!(
            kinds
                .iter()
                .filter(|k| **k == QuestionKind::Unknown)
                .count(),
            2
        );
        // Every expected value was said, and every changed one after its old value.
        let all = text(&a);
        for q in &a.questions {
            if let Some(v) = &q.expected {
                assert!(all.contains(v.as_str()), "{v}");
            }
            if let (Some(old), Some(new)) = (&q.stale, &q.expected) {
                assert!(
                    all.find(old.as_str()) < all.rfind(new.as_str()),
                    "{old} then {new}"
                );
            }
        }
    }

    #[test]
    fn answers_are_scored_by_value_and_abstention() {
        let q = SessionQuestion {
            kind: QuestionKind::Changed,
            question: "Where?".into(),
            expected: Some("Lyon".into()),
            stale: Some("Porto".into()),
        };
        assert!(session_correct(&q, "She lives in Lyon."));
        assert!(!session_correct(&q, "Porto, then Lyon"));
        let u = SessionQuestion {
            kind: QuestionKind::Unknown,
            question: "Where?".into(),
            expected: None,
            stale: None,
        };
        assert!(session_correct(&u, "Not known."));
        assert!(!session_correct(&u, "In Porto."));
    }
}
