//! Fuzzing chat logs as the daemon reads them: any bytes, and lines shaped like
//! OpenAI-style messages with every field of the wrong kind. Never a panic; complete
//! lines only are consumed, every line is a turn or an error naming it, and each turn
//! points inside the rendered text. 256 cases each by default; `PROPTEST_CASES=100000`
//! for a longer run. Failing inputs are kept in `proptest-regressions/` and replayed first.

use memagent_watcher::{parse_chat, render_message};
use proptest::prelude::*;
use serde_json::{json, Value};

/// A JSON value of any kind, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        any::<String>().prop_map(Value::from),
        Just(json!("2026-11-20T09:13:00Z")),
        Just(json!(1_763_630_000)),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec(("[a-z_]{1,8}", inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// A message with the usual fields, each of any kind.
fn message() -> impl Strategy<Value = Value> {
    (
        prop_oneof![Just(json!("user")), Just(json!("assistant")), any_json()],
        prop_oneof![
            any::<String>().prop_map(Value::from),
            any_json(),
            Just(json!([{"type": "text", "text": "hello"}, {"type": "image_url"}]))
        ],
        proptest::option::of(any_json()),
        proptest::option::of(prop_oneof![any_json(), Just(json!("13:56 8 May 2023"))]),
    )
        .prop_map(|(role, content, name, time)| {
            let mut m = json!({"role": role, "content": content});
            if let Some(name) = name {
                m["name"] = name;
            }
            if let Some(time) = time {
                m["timestamp"] = time;
            }
            m
        })
}

fn log_bytes() -> impl Strategy<Value = Vec<u8>> {
    let line = prop_oneof![
        message().prop_map(|m| format!("{m}\n").into_bytes()),
        prop::collection::vec(any::<u8>(), 0..64),
        Just(b"\n".to_vec()),
        Just(b"{\"role\": oops}\n".to_vec()),
    ];
    prop::collection::vec(line, 0..12).prop_map(|lines| lines.concat())
}

proptest! {
    #[test]
    fn any_chat_log_bytes_parse_into_turns_and_named_errors(bytes in log_bytes(), first in 0u64..1_000_000) {
        let parsed = parse_chat(&bytes, first);
        prop_assert!(parsed.consumed <= bytes.len());
        if parsed.consumed > 0 {
            prop_assert_eq!(bytes[parsed.consumed - 1], b'\n');
        }
        let newlines = bytes[..parsed.consumed].iter().filter(|&&b| b == b'\n').count() as u64;
        prop_assert_eq!(parsed.lines, newlines);
        let mut last = None;
        for &(offset, line) in &parsed.turns {
            prop_assert!((offset as usize) < parsed.text.len());
            prop_assert!(parsed.text.is_char_boundary(offset as usize));
            prop_assert!(line > first && line <= first + newlines);
            prop_assert!(last.is_none_or(|l| l < line));
            last = Some(line);
        }
        for (line, reason) in &parsed.errors {
            prop_assert!(*line > first && *line <= first + newlines);
            prop_assert!(!reason.is_empty());
        }
        prop_assert!(parsed.turns.len() + parsed.errors.len() <= newlines as usize);
    }

    #[test]
    fn any_message_renders_as_a_turn_or_says_why_not(m in message()) {
        match render_message(&m) {
            Ok(turn) => prop_assert!(!turn.is_empty()),
            Err(reason) => prop_assert!(!reason.is_empty()),
        }
    }
}
