//! Answers from chat exchanges: the passages an answer reads from a chat log. A passage
//! is a few turns of two people talking in one sitting, as an answer's prompt shows a
//! chat log's turns: the sitting's time on its first turn
//! (`[2023-05-08 13:56] user (Ana): …`), left off the turns after it (`user (Ben): …`),
//! a relative date followed by the day it means. The fact asked about is said in a
//! reply: the other speaker asks ("How was your weekend?"), the one asked about answers
//! in their own words ("We drove up to Porto!"), and the question ("Where did Ana go on
//! the weekend?") shares few of the reply's words. The answer is the reply's few words
//! that answer it, or "not known" when the passage does not say: the exchange is
//! missing, or the other speaker said it of themselves. Around it, the speakers' other
//! exchanges (values of the same kind among them) and small talk; now and then the
//! passage opens on the end of a turn cut by the window.

use chrono::{Duration, NaiveDate};
use memagent_agent::PASSAGE_ANSWER;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::Rng;

use super::{fill, picks, Example, Mode, Patterns, JOBS, PETS, RELATIONS};

/// The answer when the passage does not say (as the passage template asks).
const NOT_KNOWN: &str = "not known";

/// What a value of an exchange is drawn from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Activity,
    Place,
    Made,
    Pet,
    Job,
    Book,
    Food,
    Instrument,
    Gift,
    Race,
    Music,
    Colour,
    Event,
}

/// One exchange: the other speaker's turn that leads to it (empty: none), the reply of
/// the one asked about, holding `{value}` (and maybe `{when}`, a relative date), the
/// question about them (`{name}`, `{rel}`), and the answer as the reply gives it.
pub(super) struct Exchange {
    pub ask: &'static str,
    pub reply: &'static str,
    pub question: &'static str,
    pub answer: &'static str,
    pub kind: Kind,
}

const fn ex(
    ask: &'static str,
    reply: &'static str,
    question: &'static str,
    answer: &'static str,
    kind: Kind,
) -> Exchange {
    Exchange {
        ask,
        reply,
        question,
        answer,
        kind,
    }
}

/// The training split's exchanges.
pub(super) const TRAIN_EXCHANGES: &[Exchange] = &[
    ex(
        "What have you been up to lately?",
        "Mostly {value}, honestly. It's been so relaxing after work.",
        "What has {name} been doing lately?",
        "{value}",
        Kind::Activity,
    ),
    ex(
        "How was your weekend?",
        "Amazing! We drove up to {value} and stayed two nights.",
        "Where did {name} go on the weekend?",
        "{value}",
        Kind::Place,
    ),
    ex(
        "Did you finish that workshop you signed up for?",
        "Yes! I made {value}, I'm so proud of it.",
        "What did {name} make in the workshop?",
        "{value}",
        Kind::Made,
    ),
    ex(
        "Any news at home?",
        "We adopted a puppy {when}! The kids named her {value}.",
        "What is the name of {name}'s puppy?",
        "{value}",
        Kind::Pet,
    ),
    ex(
        "So what are you doing for work these days?",
        "I'm a {value} now, still getting used to the hours.",
        "What is {name}'s job?",
        "{value}",
        Kind::Job,
    ),
    ex(
        "Read anything good recently?",
        "I just finished \"{value}\", couldn't put it down.",
        "Which book did {name} recently read?",
        "\"{value}\"",
        Kind::Book,
    ),
    ex(
        "Something smells great, what are you making?",
        "{value}, my grandma's recipe!",
        "What did {name} cook?",
        "{value}",
        Kind::Food,
    ),
    ex(
        "",
        "Guess what, I started taking {value} lessons {when}!",
        "What instrument is {name} learning?",
        "{value}",
        Kind::Instrument,
    ),
    ex(
        "Did your {rel} like the present?",
        "Loved it! I found {value} at a little shop downtown.",
        "What did {name} give their {rel}?",
        "{value}",
        Kind::Gift,
    ),
    ex(
        "Where are you thinking of moving?",
        "Probably {value}. It's close to my family.",
        "Where is {name} thinking of moving?",
        "{value}",
        Kind::Place,
    ),
    ex(
        "What's the plan for the summer?",
        "A road trip to {value} with the kids, if the car survives!",
        "What is {name} planning for the summer?",
        "a road trip to {value}",
        Kind::Place,
    ),
    ex(
        "How's the new hobby going?",
        "I love it. {value} clears my head like nothing else.",
        "What hobby did {name} take up?",
        "{value}",
        Kind::Activity,
    ),
    ex(
        "You look exhausted, what happened?",
        "I ran my first {value} {when}! My legs are done.",
        "What race did {name} run?",
        "{value}",
        Kind::Race,
    ),
    ex(
        "What kind of music are you into?",
        "Mostly {value}, especially live.",
        "What music does {name} like?",
        "{value}",
        Kind::Music,
    ),
    ex(
        "",
        "Big news: my {rel} just got hired as a {value}!",
        "What job did {name}'s {rel} get?",
        "{value}",
        Kind::Job,
    ),
    ex(
        "Did you finish the kids' room?",
        "Finally! We went with {value} walls and it looks so cozy.",
        "What color did {name} paint the kids' room?",
        "{value}",
        Kind::Colour,
    ),
    ex(
        "What's your favorite thing to bake?",
        "{value}, no contest. The whole family fights over them.",
        "What does {name} like to bake?",
        "{value}",
        Kind::Food,
    ),
    ex(
        "How do you unwind after a long week?",
        "Honestly? {value}. Works every time.",
        "How does {name} relax?",
        "{value}",
        Kind::Activity,
    ),
    ex(
        "Where did you two first meet?",
        "At a {value}, believe it or not! Years ago now.",
        "Where did {name} meet their partner?",
        "at a {value}",
        Kind::Event,
    ),
    ex(
        "What did you do for your birthday?",
        "We went to a {value} {when}, it was the best night.",
        "What did {name} do for their birthday?",
        "went to a {value}",
        Kind::Event,
    ),
    ex(
        "Wow, where was that photo taken?",
        "That's from our trip to {value} last spring.",
        "Where did {name} travel last spring?",
        "{value}",
        Kind::Place,
    ),
    ex(
        "",
        "I've been volunteering at the {value} on weekends, it means a lot to me.",
        "Where does {name} volunteer?",
        "at the {value}",
        Kind::Event,
    ),
    ex(
        "What was in the box?",
        "{value} from my {rel}! Totally unexpected.",
        "What did {name} get from their {rel}?",
        "{value}",
        Kind::Gift,
    ),
    ex(
        "Are you still doing that class on Tuesdays?",
        "Yep, {value} every Tuesday. I'm getting better!",
        "What class does {name} take on Tuesdays?",
        "{value}",
        Kind::Activity,
    ),
];

/// The validation split's exchanges: other wordings, other questions.
pub(super) const VALIDATION_EXCHANGES: &[Exchange] = &[
    ex(
        "Anything fun lately?",
        "I got really into {value}. Can't stop!",
        "What has {name} gotten into?",
        "{value}",
        Kind::Activity,
    ),
    ex(
        "Back from the trip already?",
        "Yeah, {value} was unreal. I didn't want to leave.",
        "Where did {name} go on the trip?",
        "{value}",
        Kind::Place,
    ),
    ex(
        "So what did you end up making?",
        "{value}! Took me three weekends.",
        "What did {name} make?",
        "{value}",
        Kind::Made,
    ),
    ex(
        "What's the new kitten called?",
        "We went with {value}. She's a menace.",
        "What is {name}'s kitten called?",
        "{value}",
        Kind::Pet,
    ),
    ex(
        "How's the job hunt?",
        "Done! I start as a {value} next week.",
        "What job is {name} starting?",
        "{value}",
        Kind::Job,
    ),
    ex(
        "Any recommendations for the flight?",
        "Take \"{value}\" with you, it's brilliant.",
        "Which book did {name} recommend?",
        "\"{value}\"",
        Kind::Book,
    ),
    ex(
        "What did you bring to the party?",
        "{value}. Gone in ten minutes!",
        "What did {name} bring to the party?",
        "{value}",
        Kind::Food,
    ),
    ex(
        "Was that you playing earlier?",
        "Ha, yes, the {value}. Still learning!",
        "What instrument does {name} play?",
        "{value}",
        Kind::Instrument,
    ),
    ex(
        "How did the race go?",
        "Finished the {value} in under my goal time!",
        "What race did {name} finish?",
        "{value}",
        Kind::Race,
    ),
    ex(
        "What color did you pick in the end?",
        "{value}. It makes the whole hallway brighter.",
        "What color did {name} choose?",
        "{value}",
        Kind::Colour,
    ),
];

const ACTIVITIES: &[&str] = &[
    "pottery",
    "painting",
    "rock climbing",
    "gardening",
    "yoga",
    "swimming",
    "photography",
    "baking bread",
    "birdwatching",
    "salsa dancing",
    "woodworking",
    "kayaking",
    "knitting",
    "chess",
];
const MADE: &[&str] = &[
    "a clay bowl",
    "a wooden stool",
    "a quilt",
    "a birdhouse",
    "a ceramic vase",
    "two bookshelves",
    "a leather wallet",
    "a watercolor of the lake",
];
const BOOK_WORDS: (&[&str], &[&str]) = (
    &[
        "Silent", "Broken", "Golden", "Hidden", "Last", "Winter", "Paper", "Distant",
    ],
    &[
        "Harbor", "Garden", "Lantern", "River", "Orchard", "Map", "Kingdom", "Letters",
    ],
);
const DISHES: &[&str] = &[
    "lasagna",
    "curry",
    "pancakes",
    "banana bread",
    "apple pie",
    "dumplings",
    "paella",
    "lemon cookies",
];
const INSTRUMENTS: &[&str] = &[
    "piano",
    "violin",
    "guitar",
    "cello",
    "drums",
    "flute",
    "ukulele",
    "saxophone",
];
const GIFTS: &[&str] = &[
    "a silver necklace",
    "a cookbook",
    "a scarf",
    "a set of paints",
    "a plant",
    "concert tickets",
];
const RACES: &[&str] = &["5K", "10K", "half marathon", "marathon", "charity run"];
const MUSIC: &[&str] = &[
    "jazz",
    "classical",
    "indie rock",
    "country",
    "hip hop",
    "folk",
];
const COLOURS: &[&str] = &[
    "sage green",
    "pale yellow",
    "navy blue",
    "lavender",
    "terracotta",
];
const EVENTS: &[&str] = &[
    "music festival",
    "wedding fair",
    "animal shelter",
    "book fair",
    "food market",
    "community center",
    "comedy show",
    "concert",
];

fn value(p: &Patterns, kind: Kind, rng: &mut StdRng) -> String {
    let one = |list: &[&str], rng: &mut StdRng| list.choose(rng).expect("values").to_string();
    match kind {
        Kind::Activity => one(ACTIVITIES, rng),
        Kind::Place => one(p.places, rng),
        Kind::Made => one(MADE, rng),
        Kind::Pet => one(PETS, rng),
        Kind::Job => one(JOBS, rng),
        Kind::Book => format!("The {} {}", one(BOOK_WORDS.0, rng), one(BOOK_WORDS.1, rng)),
        Kind::Food => one(DISHES, rng),
        Kind::Instrument => one(INSTRUMENTS, rng),
        Kind::Gift => one(GIFTS, rng),
        Kind::Race => one(RACES, rng),
        Kind::Music => one(MUSIC, rng),
        Kind::Colour => one(COLOURS, rng),
        Kind::Event => one(EVENTS, rng),
    }
}

/// "yesterday [7 May 2023]" or "two days ago [6 May 2023]": said on `day`, with the day
/// it means as a passage shows it.
fn when(day: NaiveDate, rng: &mut StdRng) -> String {
    let (said, back) = *[("yesterday", 1), ("two days ago", 2), ("last night", 1)]
        .choose(rng)
        .expect("whens");
    let meant = day - Duration::days(back);
    format!("{said} [{}]", meant.format("%-d %B %Y"))
}

/// An exchange said: its turns (speaker index, text), the question and the answer.
struct Said {
    turns: Vec<(usize, String)>,
    question: String,
    answer: String,
    value: String,
}

fn say(
    p: &Patterns,
    e: &Exchange,
    speaker: usize,
    names: [&str; 2],
    day: NaiveDate,
    rng: &mut StdRng,
) -> Said {
    let v = value(p, e.kind, rng);
    let rel = *RELATIONS.choose(rng).expect("relations");
    let w = when(day, rng);
    let pairs = [
        ("name", names[speaker]),
        ("rel", rel),
        ("value", v.as_str()),
        ("when", w.as_str()),
    ];
    let mut turns = Vec::new();
    if !e.ask.is_empty() {
        turns.push((1 - speaker, fill(e.ask, &pairs)));
    }
    turns.push((speaker, fill(e.reply, &pairs)));
    let question = fill(e.question, &pairs);
    Said {
        turns,
        question,
        answer: fill(e.answer, &pairs),
        value: v,
    }
}

/// A dialogue evidence example drawn with `rng` from the patterns `p`, answered "not
/// known" for `unknown_share` of them (in twentieths).
pub(super) fn dialogue_example(p: &Patterns, unknown_share: f64, rng: &mut StdRng) -> Example {
    let people = picks(p.people, 2, rng);
    let names = [people[0], people[1]];
    let day = NaiveDate::from_ymd_opt(2022, 1, 1).expect("date")
        + Duration::days(rng.random_range(0..900));
    let stamp = format!(
        "{} {:02}:{:02}",
        day.format("%Y-%m-%d"),
        rng.random_range(8..22),
        rng.random_range(0..60)
    );
    let asked = p.exchanges.choose(rng).expect("exchanges");
    // Other exchanges of the chat, by either speaker, none asking the same question.
    let mut others: Vec<Said> = Vec::new();
    for _ in 0..rng.random_range(1..=2) {
        let e = p.exchanges.choose(rng).expect("exchanges");
        if e.question != asked.question {
            others.push(say(p, e, rng.random_range(0..2), names, day, rng));
        }
    }
    let target = say(p, asked, 0, names, day, rng);
    // Most say it; of the rest, a quarter have the other speaker say it of themselves,
    // the others leave it out.
    let unknown = (unknown_share.clamp(0.0, 1.0) * 20.0).round() as u32;
    let roll = rng.random_range(0..20);
    let said = 20 - unknown;
    let (told, swapped) = (
        roll < said,
        unknown > 0 && roll < said + unknown.div_ceil(4),
    );
    let mut said: Vec<Vec<(usize, String)>> = others.iter().map(|s| s.turns.clone()).collect();
    if told {
        said.insert(rng.random_range(0..=said.len()), target.turns.clone());
    } else if swapped {
        let theirs = say(p, asked, 1, names, day, rng);
        said.insert(rng.random_range(0..=said.len()), theirs.turns);
    }
    // Small talk between exchanges now and then.
    let mut turns: Vec<(usize, String)> = Vec::new();
    for exchange in said {
        if rng.random_bool(0.3) {
            turns.push((
                rng.random_range(0..2),
                p.openers.choose(rng).expect("o").to_string(),
            ));
        }
        turns.extend(exchange);
    }
    let mut lines: Vec<String> = Vec::new();
    if rng.random_bool(0.3) {
        // The window opened inside a turn: its last words, without a label.
        let cut = p.openers.choose(rng).expect("openers");
        let words: Vec<&str> = cut.split(' ').collect();
        lines.push(words[words.len() / 2..].join(" "));
    }
    // A sitting's turns share its time, shown once, as an answer's prompt shows them
    // (`memagent_recall::passages::times_once`).
    for (i, (speaker, text)) in turns.into_iter().enumerate() {
        match i {
            0 => lines.push(format!("[{stamp}] user ({}): {text}", names[speaker])),
            _ => lines.push(format!("user ({}): {text}", names[speaker])),
        }
    }
    let passage = lines.join("\n");
    let (answer, values) = if told {
        let mut a = target.answer.clone();
        if let Some(first) = a.get(..1) {
            a.replace_range(..1, &first.to_uppercase());
        }
        (format!("{a}."), vec![target.value.clone()])
    } else {
        (NOT_KNOWN.to_string(), Vec::new())
    };
    let stale = others
        .iter()
        .map(|s| s.value.clone())
        .filter(|v| !values.contains(v))
        .collect();
    Example {
        family: "evidence-dialogue",
        mode: Mode::General,
        kind: "evidence",
        template: PASSAGE_ANSWER,
        message: PASSAGE_ANSWER.fill(&target.question, "", &passage),
        target: answer,
        memory_before: None,
        values,
        stale,
    }
}
