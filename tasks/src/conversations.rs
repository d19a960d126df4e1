//! Question answering over real conversations: LoCoMo's schema (two people chatting over
//! months, with questions whose evidence is a list of turns) and a JSON Lines format of
//! our own for users' logs, read into one shape; and the published scoring (token F1
//! over Porter stems, with LoCoMo's per-category rules).
//!
//! The JSON Lines format has two kinds of lines, each naming its `conversation`:
//!
//! ```text
//! {"conversation": "trip", "id": "t1", "name": "Ana", "content": "I flew to Rome yesterday.", "timestamp": "2023-05-11 14:02"}
//! {"conversation": "trip", "question": "When did Ana fly to Rome?", "answer": "10 May 2023", "evidence": ["t1"], "category": "temporal"}
//! ```
//!
//! A turn may also carry `role` (default `user`); `id` is what a question's `evidence`
//! names (an entry may list several ids between semicolons). `category` is one of `multi-hop`, `temporal`, `open-domain`, `single-hop`,
//! `adversarial` (or LoCoMo's numbers 1–5); a question without `answer` is adversarial:
//! the conversation never says, and the right answer says so.

use std::collections::HashMap;
use std::path::Path;

use chrono::NaiveDateTime;
use serde::Serialize;
use serde_json::Value;

use crate::{Error, Result};

/// The kinds of question LoCoMo asks, with its numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Category {
    MultiHop = 1,
    Temporal = 2,
    OpenDomain = 3,
    SingleHop = 4,
    Adversarial = 5,
}

impl Category {
    pub const ALL: [Category; 5] = [
        Category::SingleHop,
        Category::MultiHop,
        Category::Temporal,
        Category::OpenDomain,
        Category::Adversarial,
    ];

    fn from_value(value: &Value) -> Option<Self> {
        match value {
            Value::Number(n) => match n.as_u64()? {
                1 => Some(Self::MultiHop),
                2 => Some(Self::Temporal),
                3 => Some(Self::OpenDomain),
                4 => Some(Self::SingleHop),
                5 => Some(Self::Adversarial),
                _ => None,
            },
            Value::String(s) => Self::ALL.into_iter().find(|c| c.name() == s),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::MultiHop => "multi-hop",
            Self::Temporal => "temporal",
            Self::OpenDomain => "open-domain",
            Self::SingleHop => "single-hop",
            Self::Adversarial => "adversarial",
        }
    }
}

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    /// What questions' evidence names (LoCoMo's `dia_id`, "D3:5").
    pub id: String,
    pub speaker: String,
    pub text: String,
    /// When it was said, as the chat log writes it (LoCoMo: its session's time as
    /// `YYYY-MM-DD HH:MM`).
    pub time: Option<String>,
}

/// A question with its gold answer and evidence turns.
#[derive(Debug, Clone, PartialEq)]
pub struct Question {
    pub question: String,
    /// `None` for an adversarial question (nothing said answers it).
    pub answer: Option<String>,
    pub evidence: Vec<String>,
    pub category: Category,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    pub id: String,
    pub turns: Vec<Turn>,
    pub questions: Vec<Question>,
}

impl Turn {
    /// The turn as a chat log's line (`memctl ingest --format chat-jsonl`): the speaker as
    /// the name, the time as `YYYY-MM-DD HH:MM`.
    pub fn chat_message(&self) -> Value {
        let mut m = serde_json::json!({"role": "user", "name": self.speaker, "content": self.text});
        if let Some(t) = &self.time {
            m["timestamp"] = Value::String(t.clone());
        }
        m
    }
}

/// Reads conversations from `path`: LoCoMo's JSON (an array of samples with
/// `conversation` and `qa`) or the JSON Lines format of the module documentation.
pub fn load_conversations(path: &Path) -> Result<Vec<Conversation>> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let invalid = |what: String| Error::InvalidRequest(format!("{}: {what}", path.display()));
    if text.trim_start().starts_with('[') {
        let samples: Vec<Value> =
            serde_json::from_str(&text).map_err(|e| invalid(format!("not LoCoMo JSON ({e})")))?;
        return samples
            .iter()
            .enumerate()
            .map(|(i, s)| locomo_sample(s).map_err(|e| invalid(format!("sample {}: {e}", i + 1))))
            .collect();
    }
    jsonl_conversations(&text).map_err(invalid)
}

/// LoCoMo's session time, "1:56 pm on 8 May, 2023".
pub fn locomo_time(text: &str) -> Option<NaiveDateTime> {
    let upper = text
        .trim()
        .replace("am on", "AM on")
        .replace("pm on", "PM on");
    NaiveDateTime::parse_from_str(&upper, "%I:%M %p on %d %B, %Y").ok()
}

fn locomo_sample(sample: &Value) -> std::result::Result<Conversation, String> {
    let id = sample["sample_id"]
        .as_str()
        .unwrap_or("conversation")
        .to_string();
    let conv = sample["conversation"]
        .as_object()
        .ok_or("no `conversation` object")?;
    let mut sessions: Vec<(u64, &Value)> = conv
        .iter()
        .filter_map(|(k, v)| {
            let n = k.strip_prefix("session_")?.parse().ok()?;
            Some((n, v))
        })
        .collect();
    sessions.sort_by_key(|(n, _)| *n);
    let mut turns = Vec::new();
    for (n, session) in sessions {
        let time = conv
            .get(&format!("session_{n}_date_time"))
            .and_then(Value::as_str)
            .and_then(locomo_time)
            .map(|t| t.format("%Y-%m-%d %H:%M").to_string());
        for turn in session
            .as_array()
            .ok_or(format!("session_{n} is not a list"))?
        {
            let field = |name: &str| {
                turn[name]
                    .as_str()
                    .map(str::to_string)
                    .ok_or(format!("a turn of session_{n} has no `{name}`"))
            };
            let mut text = field("text")?;
            // A shared photo is part of what was said.
            if let Some(caption) = turn["blip_caption"].as_str() {
                text.push_str(&format!(" [shares a photo of {caption}]"));
            }
            turns.push(Turn {
                id: field("dia_id")?,
                speaker: field("speaker")?,
                text,
                time: time.clone(),
            });
        }
    }
    let questions = sample["qa"]
        .as_array()
        .ok_or("no `qa` list")?
        .iter()
        .enumerate()
        .map(|(i, q)| question(q).map_err(|e| format!("qa[{i}]: {e}")))
        .collect::<std::result::Result<_, _>>()?;
    Ok(Conversation {
        id,
        turns,
        questions,
    })
}

fn question(q: &Value) -> std::result::Result<Question, String> {
    let text = q["question"].as_str().ok_or("no `question`")?.to_string();
    let answer = match &q["answer"] {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    };
    let category = match q.get("category") {
        Some(c) => Category::from_value(c).ok_or(format!(
            "unknown category {c}; expected 1-5 or one of single-hop, multi-hop, temporal, \
             open-domain, adversarial"
        ))?,
        None if answer.is_none() => Category::Adversarial,
        None => Category::SingleHop,
    };
    // A list of turn ids; an entry may name several between semicolons ("D8:6; D9:17",
    // as a few of LoCoMo's do), and so may a single string.
    let entries: Vec<&str> = match &q["evidence"] {
        Value::Null => Vec::new(),
        Value::String(ids) => vec![ids.as_str()],
        Value::Array(list) => list
            .iter()
            .map(|v| {
                v.as_str().ok_or(format!(
                    "`evidence` holds {v}; expected turn ids as strings, like [\"t1\"]"
                ))
            })
            .collect::<std::result::Result<_, _>>()?,
        other => {
            return Err(format!(
                "`evidence` is {other}; expected a list of turn ids, like [\"t1\"]"
            ))
        }
    };
    let evidence = entries
        .into_iter()
        .flat_map(|ids| ids.split(';'))
        .map(str::trim)
        .filter(|id| !id.is_empty())
        .map(str::to_string)
        .collect();
    Ok(Question {
        question: text,
        answer: answer.filter(|_| category != Category::Adversarial),
        evidence,
        category,
    })
}

fn jsonl_conversations(text: &str) -> std::result::Result<Vec<Conversation>, String> {
    let mut order: Vec<String> = Vec::new();
    let mut by_id: HashMap<String, Conversation> = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = |e: String| format!("line {}: {e}", i + 1);
        let value: Value = serde_json::from_str(line).map_err(|e| at(format!("not JSON ({e})")))?;
        let name = value["conversation"]
            .as_str()
            .ok_or_else(|| at("no `conversation` name".into()))?
            .to_string();
        let conv = by_id.entry(name.clone()).or_insert_with(|| {
            order.push(name.clone());
            Conversation {
                id: name,
                turns: Vec::new(),
                questions: Vec::new(),
            }
        });
        if value.get("question").is_some() {
            conv.questions.push(question(&value).map_err(at)?);
            continue;
        }
        let content = value["content"]
            .as_str()
            .ok_or_else(|| at("neither a `question` nor a turn with `content`".into()))?;
        let time = match value.get("timestamp").or(value.get("time")) {
            Some(Value::String(t)) => Some(t.clone()),
            None | Some(Value::Null) => None,
            Some(_) => return Err(at("`timestamp` is not a string".into())),
        };
        let n = conv.turns.len() + 1;
        conv.turns.push(Turn {
            id: value["id"].as_str().map_or(n.to_string(), str::to_string),
            speaker: value["name"]
                .as_str()
                .or(value["role"].as_str())
                .unwrap_or("user")
                .to_string(),
            text: content.to_string(),
            time,
        });
    }
    Ok(order
        .into_iter()
        .filter_map(|id| by_id.remove(&id))
        .collect())
}

/// LoCoMo's normalisation: lower case, commas and punctuation dropped, the words "a",
/// "an", "the" and "and" dropped, each word Porter-stemmed.
pub fn answer_words(text: &str) -> Vec<String> {
    let stemmer = frostem::Stemmer::new(frostem::Algorithm::Porter);
    let lowered: String = text
        .to_lowercase()
        .chars()
        .filter(|c| !c.is_ascii_punctuation())
        .collect();
    lowered
        .split_whitespace()
        .filter(|w| !matches!(*w, "a" | "an" | "the" | "and"))
        .map(|w| stemmer.stem(w).into_owned())
        .collect()
}

/// Token F1 of two texts' [`answer_words`] (0 when either has none).
pub fn token_f1(prediction: &str, gold: &str) -> f64 {
    let p = answer_words(prediction);
    let mut g = answer_words(gold);
    let (np, ng) = (p.len(), g.len());
    let mut common = 0usize;
    for w in &p {
        if let Some(i) = g.iter().position(|x| x == w) {
            g.swap_remove(i);
            common += 1;
        }
    }
    if common == 0 {
        return 0.0;
    }
    let (precision, recall) = (common as f64 / np as f64, common as f64 / ng as f64);
    2.0 * precision * recall / (precision + recall)
}

/// Whether an answer says the conversation does not tell, as LoCoMo's scoring reads it.
pub fn says_not_mentioned(answer: &str) -> bool {
    let a = answer.to_lowercase();
    a.contains("not mentioned") || a.contains("no information available")
}

/// An answer's score as published: adversarial questions 1 when the answer says "not
/// mentioned"; multi-hop answers split on commas, each gold part scored against the
/// answer's best part and averaged; open-domain gold cut at its first ';'; the rest
/// token F1.
pub fn locomo_score(q: &Question, prediction: &str) -> f64 {
    let Some(gold) = q.answer.as_deref() else {
        return f64::from(u8::from(says_not_mentioned(prediction)));
    };
    match q.category {
        Category::MultiHop => {
            let parts: Vec<&str> = prediction.split(',').map(str::trim).collect();
            let golds: Vec<&str> = gold.split(',').map(str::trim).collect();
            golds
                .iter()
                .map(|g| parts.iter().map(|p| token_f1(p, g)).fold(0.0, f64::max))
                .sum::<f64>()
                / golds.len() as f64
        }
        Category::OpenDomain => token_f1(prediction, gold.split(';').next().unwrap_or(gold)),
        _ => token_f1(prediction, gold),
    }
}

/// Whether the answer holds every word of the gold answer (after [`answer_words`]).
pub fn holds_gold_words(q: &Question, prediction: &str) -> bool {
    let Some(gold) = q.answer.as_deref() else {
        return says_not_mentioned(prediction);
    };
    let have = answer_words(prediction);
    let want = answer_words(gold);
    !want.is_empty() && want.iter().all(|w| have.contains(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(category: Category, answer: Option<&str>) -> Question {
        Question {
            question: "?".into(),
            answer: answer.map(String::from),
            evidence: Vec::new(),
            category,
        }
    }

    #[test]
    fn scoring_follows_the_published_rules() {
        // Stems and dropped words: "The sunday before" against "sundays before".
        let f = token_f1(
            "Sundays before 25 May, 2023",
            "The sunday before 25 May 2023",
        );
        assert!((f - 1.0).abs() < 1e-9, "{f}");
        assert_eq!(token_f1("Paris", "Rome"), 0.0);
        // The year alone: one word of three.
        let f = locomo_score(&q(Category::Temporal, Some("7 May 2023")), "2023");
        assert!((f - 0.5).abs() < 1e-9, "{f}");
        // Multi-hop: each gold part against the best part of the answer.
        let f = locomo_score(&q(Category::MultiHop, Some("Paris, Rome")), "Rome, Berlin");
        assert!((f - 0.5).abs() < 1e-9, "{f}");
        // Open-domain gold is cut at ';'.
        let f = locomo_score(
            &q(Category::OpenDomain, Some("Psychology; maybe counseling")),
            "psychology",
        );
        assert!((f - 1.0).abs() < 1e-9, "{f}");
        let adversarial = q(Category::Adversarial, None);
        assert_eq!(
            locomo_score(&adversarial, "Not mentioned in the chat."),
            1.0
        );
        assert_eq!(locomo_score(&adversarial, "Not known."), 0.0);
        assert!(holds_gold_words(
            &q(Category::SingleHop, Some("a pottery class")),
            "She took pottery classes."
        ));
        assert!(!holds_gold_words(
            &q(Category::SingleHop, Some("pottery class")),
            "She took pottery."
        ));
    }

    #[test]
    fn both_formats_read_into_conversations() {
        assert_eq!(
            locomo_time("1:56 pm on 8 May, 2023").map(|t| t.to_string()),
            Some("2023-05-08 13:56:00".into())
        );
        assert_eq!(
            locomo_time("12:28 am on 8 November, 2023").map(|t| t.to_string()),
            Some("2023-11-08 00:28:00".into())
        );
        let dir = std::env::temp_dir().join(format!("memagent-conv-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let locomo = dir.join("locomo.json");
        std::fs::write(
            &locomo,
            r#"[{"sample_id": "c1", "conversation": {"speaker_a": "A", "speaker_b": "B",
              "session_2_date_time": "9:00 am on 2 June, 2023",
              "session_2": [{"speaker": "B", "dia_id": "D2:1", "text": "Later."}],
              "session_1_date_time": "1:56 pm on 8 May, 2023",
              "session_1": [{"speaker": "A", "dia_id": "D1:1", "text": "Look!", "blip_caption": "a dog"}]},
              "qa": [{"question": "When?", "answer": 2022, "evidence": ["D1:1"], "category": 2},
                     {"question": "Why?", "evidence": ["D2:1"], "category": 5, "adversarial_answer": "x"},
                     {"question": "Both?", "answer": "yes", "evidence": ["D1:1; D2:1"], "category": 1}]}]"#,
        )
        .unwrap();
        let convs = load_conversations(&locomo).unwrap();
        assert_eq!(convs.len(), 1);
        let c = &convs[0];
        assert_eq!(c.turns[0].id, "D1:1", "sessions in their order");
        assert_eq!(c.turns[0].text, "Look! [shares a photo of a dog]");
        assert_eq!(
            c.turns[0].chat_message()["timestamp"],
            Value::String("2023-05-08 13:56".into())
        );
        assert_eq!(c.questions[0].answer.as_deref(), Some("2022"));
        assert_eq!(c.questions[1].category, Category::Adversarial);
        assert_eq!(c.questions[1].answer, None);
        assert_eq!(
            c.questions[2].evidence,
            ["D1:1", "D2:1"],
            "one entry, two turns"
        );

        let own = dir.join("own.jsonl");
        std::fs::write(
            &own,
            "{\"conversation\": \"trip\", \"id\": \"t1\", \"name\": \"Ana\", \"content\": \"I flew to Rome yesterday.\", \"timestamp\": \"2023-05-11 14:02\"}\n\
             {\"conversation\": \"trip\", \"question\": \"When did Ana fly?\", \"answer\": \"10 May 2023\", \"evidence\": [\"t1\"], \"category\": \"temporal\"}\n",
        )
        .unwrap();
        let convs = load_conversations(&own).unwrap();
        assert_eq!(convs[0].turns[0].speaker, "Ana");
        assert_eq!(convs[0].questions[0].category, Category::Temporal);
        // Evidence as one string is read as a list of it; anything else but a list of
        // strings is refused with its line.
        std::fs::write(
            &own,
            "{\"conversation\": \"trip\", \"id\": \"t1\", \"name\": \"Ana\", \"content\": \"Hi.\"}\n\
             {\"conversation\": \"trip\", \"question\": \"Q?\", \"answer\": \"x\", \"evidence\": \"t1; t2\"}\n",
        )
        .unwrap();
        let convs = load_conversations(&own).unwrap();
        assert_eq!(convs[0].questions[0].evidence, ["t1", "t2"]);
        std::fs::write(
            &own,
            "{\"conversation\": \"trip\", \"id\": \"t1\", \"name\": \"Ana\", \"content\": \"Hi.\"}\n\
             {\"conversation\": \"trip\", \"question\": \"Q?\", \"answer\": \"x\", \"evidence\": [1]}\n",
        )
        .unwrap();
        let err = load_conversations(&own).unwrap_err().to_string();
        assert!(
            err.contains("line 2") && err.contains("`evidence` holds 1"),
            "{err}"
        );
        std::fs::write(&own, "{\"conversation\": \"x\", \"nothing\": 1}\n").unwrap();
        let err = load_conversations(&own).unwrap_err().to_string();
        assert!(err.contains("line 1") && err.contains("content"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
