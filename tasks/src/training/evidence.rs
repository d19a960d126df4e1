//! Answers with evidence: the prompts `memctl query` builds, one per passage a search
//! found (or the memory's notes in a passage's place), each answered from that passage
//! alone: what it says of the question, or "not known". Code then keeps the newest
//! passage's answer, or every passage's for a list. The passages are written as the
//! search finds them (chat turns with their role and, now and then, their time), from
//! the split's own sentence patterns, drawn from a conversation or document:
//!
//! - `stated`: one passage says it, among passages about other people and things;
//! - `changed`: a passage says it, a later one changes it (each answers with its own
//!   value), among unrelated passages;
//! - `unknown`: the passages are about the same people but not what is asked;
//! - `list`: several passages each give one value of a key beside values of other keys;
//! - `single`: one value of a key beside other keys'.
//!
//! Half the examples ask a passage that answers, when the draw has one.

use memagent_agent::PASSAGE_ANSWER;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::Rng;

use super::{
    fill, picks, sentence, value_of, Example, Mode, Patterns, FOODS, ITEMS, JOBS, MONTHS, PETS,
    RELATIONS, REPORTS, SMALL_TALK,
};

/// The families of evidence examples, with the weight each is drawn with.
pub const EVIDENCE_FAMILIES: [(&str, u32); 5] = [
    ("evidence-stated", 3),
    ("evidence-changed", 3),
    ("evidence-unknown", 1),
    ("evidence-list", 3),
    ("evidence-single", 1),
];

/// The answer when the passage does not say (as the passage template asks).
const NOT_KNOWN: &str = "not known";

/// A chat fact said by the user: what was said, the answer sentence and the question.
struct ChatFact {
    said: String,
    answer: String,
    question: String,
}

/// The values of a chat pattern's placeholders.
#[derive(Clone)]
struct Values(Vec<(&'static str, String)>);

impl Values {
    fn draw(p: &Patterns, name2: &str, rel: &str, rng: &mut StdRng) -> Self {
        let keys = [
            "name", "name2", "rel", "date", "place", "food", "job", "item", "pet",
        ];
        Self(
            keys.iter()
                .map(|&k| {
                    let v = match k {
                        "name" | "name2" => name2.to_string(),
                        "rel" => rel.to_string(),
                        _ => value(p, k, rng),
                    };
                    (k, v)
                })
                .collect(),
        )
    }

    /// These values with `key` drawn again (another value than before, when the list
    /// has one).
    fn changed(&self, p: &Patterns, key: &str, rng: &mut StdRng) -> Self {
        let mut out = self.clone();
        for (k, v) in &mut out.0 {
            if *k == key || (key == "name2" && *k == "name") || (key == "name" && *k == "name2") {
                let old = v.clone();
                for _ in 0..8 {
                    *v = value(p, key, rng);
                    if *v != old {
                        break;
                    }
                }
            }
        }
        out
    }

    fn get(&self, key: &str) -> String {
        self.0
            .iter()
            .find(|(k, _)| *k == key)
            .map_or(String::new(), |(_, v)| v.clone())
    }

    fn fact(&self, pattern: (&str, &str, &str)) -> ChatFact {
        let pairs: Vec<(&str, &str)> = self.0.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (said, remembered, question) = pattern;
        ChatFact {
            said: fill(said, &pairs),
            answer: fill(remembered, &pairs),
            question: fill(question, &pairs),
        }
    }
}

fn value(p: &Patterns, key: &str, rng: &mut StdRng) -> String {
    match key {
        "name" | "name2" => p.people.choose(rng).expect("people").to_string(),
        "rel" => RELATIONS.choose(rng).expect("relations").to_string(),
        "date" => format!(
            "{} {}",
            MONTHS.choose(rng).expect("months"),
            rng.random_range(1..=28)
        ),
        "place" => p.places.choose(rng).expect("places").to_string(),
        "food" => FOODS.choose(rng).expect("foods").to_string(),
        "job" => JOBS.choose(rng).expect("jobs").to_string(),
        "item" => ITEMS.choose(rng).expect("items").to_string(),
        _ => PETS.choose(rng).expect("pets").to_string(),
    }
}

/// The placeholder a remembered fact ends on: its value (the rest is its subject).
fn value_key(remembered: &str) -> &str {
    remembered
        .rsplit_once('{')
        .and_then(|(_, rest)| rest.split_once('}'))
        .map_or("", |(key, _)| key)
}

fn chat_fact(
    p: &Patterns,
    pattern: (&str, &str, &str),
    name2: &str,
    rel: &str,
    rng: &mut StdRng,
) -> ChatFact {
    Values::draw(p, name2, rel, rng).fact(pattern)
}

/// A chat turn as a passage: `user: …`, with its time now and then.
fn turn(text: &str, day: u32, rng: &mut StdRng) -> String {
    if rng.random_bool(0.4) {
        format!(
            "[{}-{:02}-{:02} {:02}:{:02}] user: {text}",
            2024 + day / 336,
            1 + day / 28 % 12,
            1 + day % 28,
            rng.random_range(8..22),
            rng.random_range(0..60)
        )
    } else {
        format!("user: {text}")
    }
}

/// A small-talk or passing-remark turn.
fn chatter(p: &Patterns, rng: &mut StdRng) -> String {
    if rng.random_bool(0.5) {
        p.openers.choose(rng).expect("openers").to_string()
    } else {
        let parts = p.passing.choose(rng).expect("passing");
        sentence(parts, rng)
    }
}

/// An evidence example drawn with `rng` from the patterns `p`.
pub(super) fn evidence_example(p: &Patterns, rng: &mut StdRng) -> Example {
    let total: u32 = EVIDENCE_FAMILIES.iter().map(|(_, w)| w).sum();
    let mut draw = rng.random_range(0..total);
    let mut family = EVIDENCE_FAMILIES[0].0;
    for (name, weight) in EVIDENCE_FAMILIES {
        if draw < weight {
            family = name;
            break;
        }
        draw -= weight;
    }
    let Answered {
        question,
        passages,
        own,
    } = match family {
        "evidence-list" => keyed(p, true, rng),
        "evidence-single" => keyed(p, false, rng),
        "evidence-changed" => chat(p, Told::Changed, rng),
        "evidence-unknown" => chat(p, Told::Not, rng),
        _ => chat(p, Told::Once, rng),
    };
    let answering: Vec<usize> = (0..own.len()).filter(|&i| own[i].is_some()).collect();
    let (passage, target, values) = if rng.random_bool(0.15) {
        // The memory's notes in a passage's place: a line about someone else.
        let pattern = *p.chat.choose(rng).expect("chat");
        let name = p.people.choose(rng).expect("people");
        let notes = chat_fact(p, pattern, name, RELATIONS.choose(rng).expect("r"), rng).answer;
        (notes, NOT_KNOWN.to_string(), Vec::new())
    } else {
        let i = match answering.choose(rng) {
            Some(&i) if rng.random_bool(0.5) => i,
            _ => rng.random_range(0..passages.len()),
        };
        match &own[i] {
            Some((answer, value)) => (passages[i].clone(), answer.clone(), vec![value.clone()]),
            None => (passages[i].clone(), NOT_KNOWN.to_string(), Vec::new()),
        }
    };
    // Values other passages give, which this one's answer must not.
    let stale = own
        .iter()
        .flatten()
        .map(|(_, v)| v.clone())
        .filter(|v| !values.contains(v) && !passage.contains(v.as_str()))
        .collect();
    Example {
        family,
        mode: Mode::General,
        kind: "evidence",
        template: PASSAGE_ANSWER,
        message: PASSAGE_ANSWER.fill(&question, "", &passage),
        target,
        memory_before: None,
        values,
        stale,
    }
}

/// A question, the passages for it, and what each of them alone answers.
struct Answered {
    question: String,
    passages: Vec<String>,
    /// Each passage's own answer and the value it states; `None`: it does not say.
    own: Vec<Option<(String, String)>>,
}

/// What the chat passages tell of the fact asked about.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Told {
    Once,
    Changed,
    Not,
}

/// Chat passages: a fact (stated, changed, or absent) among other turns.
fn chat(p: &Patterns, told: Told, rng: &mut StdRng) -> Answered {
    // Patterns that name someone else ({name2}) give each fact its own subject.
    let pattern = *p.chat.choose(rng).expect("chat");
    let names = picks(p.people, 4, rng);
    let rel = *RELATIONS.choose(rng).expect("relations");
    let values = Values::draw(p, names[0], rel, rng);
    let fact = values.fact(pattern);
    // Other facts: other patterns (other slots), or the same pattern about someone else
    // when it names a person.
    let mut others: Vec<ChatFact> = Vec::new();
    for name in &names[1..] {
        let other = *p.chat.choose(rng).expect("chat");
        if other.2 == pattern.2 && !other.0.contains("{name2}") {
            continue;
        }
        let o = chat_fact(p, other, name, RELATIONS.choose(rng).expect("r"), rng);
        if o.question != fact.question {
            others.push(o);
        }
    }
    let mut turns = Turns {
        passages: Vec::new(),
        own: Vec::new(),
        day: rng.random_range(0..300u32),
        others,
    };
    let key = value_key(pattern.1);
    match told {
        Told::Changed => {
            // The same slot again with a new value, as a change.
            // The same subject with another value: said in a change's own words when
            // the patterns have one for this question, else said again with a flag.
            let new_values = values.changed(p, key, rng);
            let updates: Vec<_> = p.chat_updates.iter().filter(|u| u.2 == pattern.2).collect();
            let new = new_values.fact(pattern);
            let said = match updates.choose(rng) {
                Some(update) if rng.random_bool(0.7) => new_values.fact(**update).said,
                _ => {
                    let flag = [
                        "Actually, ",
                        "Update: ",
                        "Correction: ",
                        "Change of plan: ",
                        "",
                    ]
                    .choose(rng)
                    .expect("flags");
                    let mut s = new.said.clone();
                    // "Actually, my sister …", but "Actually, I …" and "Actually, Lucia …".
                    let named = pattern.0.starts_with('{');
                    if !flag.is_empty() && !named && !s.starts_with("I ") && !s.starts_with("I'") {
                        s.replace_range(..1, &s[..1].to_lowercase());
                    }
                    format!("{flag}{s}")
                }
            };
            turns.filler(p, 2, rng);
            turns.say(&fact.said, Some((fact.answer, values.get(key))), rng);
            turns.filler(p, 2, rng);
            turns.say(&said, Some((new.answer, new_values.get(key))), rng);
            turns.filler(p, 2, rng);
        }
        Told::Not => {
            turns.filler(p, 4, rng);
            if turns.passages.is_empty() {
                turns.say(&chatter(p, rng), None, rng);
            }
        }
        Told::Once => {
            turns.filler(p, 3, rng);
            turns.say(&fact.said, Some((fact.answer, values.get(key))), rng);
            turns.filler(p, 3, rng);
        }
    }
    // Asked in the user's own words now and then ("Where does my sister live?").
    let question = if rng.random_bool(0.4) {
        fact.question.replace("the user's ", "my ")
    } else {
        fact.question
    };
    Answered {
        question,
        passages: turns.passages,
        own: turns.own,
    }
}

/// Chat turns as passages, days apart.
struct Turns {
    passages: Vec<String>,
    /// What each passage answers of the question asked.
    own: Vec<Option<(String, String)>>,
    day: u32,
    /// Facts about other people and things, said as filler.
    others: Vec<ChatFact>,
}

impl Turns {
    fn say(&mut self, text: &str, own: Option<(String, String)>, rng: &mut StdRng) {
        self.day += rng.random_range(1..40);
        self.passages.push(turn(text, self.day, rng));
        self.own.push(own);
    }

    /// Up to `max` turns of other facts and small talk.
    fn filler(&mut self, p: &Patterns, max: usize, rng: &mut StdRng) {
        for _ in 0..rng.random_range(0..=max) {
            let text = match self.others.pop() {
                Some(o) if rng.random_bool(0.7) => o.said,
                _ => chatter(p, rng),
            };
            self.say(&text, None, rng);
        }
    }
}

/// Document passages holding values of keys: all of one key's (`list`) or its one.
fn keyed(p: &Patterns, list: bool, rng: &mut StdRng) -> Answered {
    let kind = *p.kinds.choose(rng).expect("kinds");
    let keys = picks(p.keys, 3, rng);
    let key = keys[0];
    let n = if list { rng.random_range(2..=5) } else { 1 };
    let mut facts: Vec<(bool, String, String)> = Vec::new();
    let multi: Vec<&str> = p
        .facts
        .iter()
        .copied()
        .filter(|f| !list || f.contains("One of"))
        .collect();
    let multi = if multi.is_empty() {
        p.facts.to_vec()
    } else {
        multi
    };
    for _ in 0..n {
        let value = value_of(kind, rng);
        let pattern = multi.choose(rng).expect("facts");
        facts.push((
            true,
            fill(pattern, &[("kind", kind), ("key", key), ("value", &value)]),
            value,
        ));
    }
    for other in &keys[1..rng.random_range(1..=keys.len())] {
        let value = value_of(kind, rng);
        let pattern = p.facts.choose(rng).expect("facts");
        facts.push((
            false,
            fill(
                pattern,
                &[("kind", kind), ("key", other), ("value", &value)],
            ),
            value,
        ));
    }
    // Shuffled by position in the text, each with a filler sentence now and then.
    let mut order: Vec<usize> = (0..facts.len()).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.random_range(0..=i));
    }
    let mut passages = Vec::new();
    let mut own = Vec::new();
    for i in order {
        let (relevant, text, value) = &facts[i];
        own.push(relevant.then(|| (format!("The {kind} for {key} is {value}."), value.clone())));
        let fillers = [REPORTS, SMALL_TALK];
        let around = sentence(fillers.choose(rng).expect("fillers"), rng);
        passages.push(match rng.random_range(0..3) {
            0 => format!("{around} {text}"),
            1 => format!("{text} {around}"),
            _ => text.clone(),
        });
    }
    let pattern = if list {
        p.ask_all.choose(rng).expect("ask_all")
    } else {
        p.ask_one.choose(rng).expect("ask_one")
    };
    Answered {
        question: fill(pattern, &[("kind", kind), ("key", key)]),
        passages,
        own,
    }
}
