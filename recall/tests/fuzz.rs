//! Fuzzing the text recall reads: passage cutting and relative dates, on text built from
//! a chat's pieces (turn headers, date words, numbers, punctuation, newlines) mixed with
//! arbitrary Unicode. Never a panic; every span on character boundaries, in order, inside
//! the text. 256 cases each by default; `PROPTEST_CASES=100000` for a longer run.
//! Failing inputs are kept in `proptest-regressions/` and replayed first.

use chrono::{DateTime, NaiveDateTime};
use memagent_recall::{dates, passages};
use proptest::prelude::*;

/// Text shaped like what recall meets, with arbitrary Unicode in between.
fn chat_text() -> impl Strategy<Value = String> {
    chat_pieces(80)
}

/// Up to `most` pieces of chat-shaped text joined by spaces.
fn chat_pieces(most: usize) -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("[2023-05-08 13:56] user (Ana): ".to_string()),
        Just("[2023-13-45 99:99] ".to_string()),
        Just("assistant: ".to_string()),
        Just("\n".to_string()),
        Just("\n\n".to_string()),
        Just("\r\n".to_string()),
        Just(". ".to_string()),
        Just("? ".to_string()),
        prop::sample::select(vec![
            "yesterday",
            "today",
            "tomorrow",
            "last",
            "next",
            "this",
            "week",
            "weekend",
            "month",
            "year",
            "ago",
            "a",
            "couple",
            "of",
            "few",
            "two",
            "three",
            "in",
            "March",
            "Saturday",
            "night",
            "morning",
            "2023",
            "10",
            "31",
            "May",
        ])
        .prop_map(str::to_string),
        "[a-zA-Z]{1,12}",
        any::<String>(),
        any::<char>().prop_map(String::from),
    ];
    prop::collection::vec(piece, 0..most).prop_map(|pieces| pieces.join(" "))
}

fn instant() -> impl Strategy<Value = NaiveDateTime> {
    (-62_000_000_000i64..250_000_000_000).prop_map(|secs| {
        DateTime::from_timestamp(secs, 0)
            .expect("in chrono's range")
            .naive_utc()
    })
}

proptest! {
    #[test]
    fn cutting_any_text_gives_spans_inside_it(text in chat_text()) {
        let cut = passages::cut(&text);
        prop_assert!(cut.tail <= text.len());
        for span in cut.closed.iter().chain(&cut.open) {
            prop_assert!(span.start < span.end, "{span:?}");
            prop_assert!(span.end <= text.len());
            prop_assert!(text.is_char_boundary(span.start) && text.is_char_boundary(span.end));
        }
        for pair in cut.closed.windows(2) {
            prop_assert!(pair[0].start <= pair[1].start, "{:?}", pair);
        }
        for span in &cut.open {
            prop_assert!(span.start >= cut.tail, "{span:?} before the tail {}", cut.tail);
        }
    }

    #[test]
    fn cutting_piece_by_piece_equals_cutting_whole(
        text in chat_pieces(900),
        steps in prop::collection::vec(1usize..600, 1..40),
    ) {
        let whole = passages::cut(&text);
        let (mut closed, mut open, mut tail, mut len) = (Vec::new(), Vec::new(), 0, 0);
        for step in steps.iter().cycle() {
            if len == text.len() {
                break;
            }
            len = (len + step).min(text.len());
            while !text.is_char_boundary(len) {
                len += 1;
            }
            let c = passages::cut(&text[tail..len]);
            let shift = |s: &passages::Span| (s.start + tail, s.end + tail);
            closed.extend(c.closed.iter().map(shift));
            open = c.open.iter().map(shift).collect();
            tail += c.tail;
        }
        let spans = |s: &[passages::Span]| s.iter().map(|s| (s.start, s.end)).collect::<Vec<_>>();
        prop_assert_eq!(closed, spans(&whole.closed));
        prop_assert_eq!(open, spans(&whole.open));
    }

    #[test]
    fn relative_dates_in_any_text_resolve_to_spans_of_it(text in chat_text(), at in instant()) {
        let found = dates::resolve(&text, at);
        let mut after = 0;
        for r in &found {
            prop_assert!(r.start < r.end && r.end <= text.len(), "{r:?}");
            prop_assert!(text.is_char_boundary(r.start) && text.is_char_boundary(r.end));
            prop_assert!(r.start >= after, "overlapping {r:?}");
            prop_assert!(!r.means.is_empty());
            after = r.end;
        }
        // Annotating keeps the text and adds each meaning.
        let annotated = dates::annotate(&text, at);
        prop_assert!(annotated.len() >= text.len());
        for r in &found {
            prop_assert!(annotated.contains(&r.means));
        }
        let _ = dates::names_a_date(&text);
        let _ = dates::dated(&text, Some(at));
    }

    #[test]
    fn any_time_stamp_parses_or_is_refused(text in prop_oneof![
        any::<String>(),
        "[0-9]{4}-[0-9]{2}-[0-9]{2}( [0-9]{2}:[0-9]{2}(:[0-9]{2})?)?",
        "[0-9]{1,2}:[0-9]{2} [ap]m on [0-9]{1,2} [A-Z][a-z]+, [0-9]{4}",
    ]) {
        let _ = dates::parse_time(&text);
        let _ = passages::turn_time(&text);
        let _ = passages::turn_speaker(&text);
    }
}
