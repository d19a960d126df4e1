//! Relative dates in chat turns resolved against the turn's time: "I went yesterday",
//! said on 8 May 2023, is shown as "I went yesterday [7 May 2023]", so whoever reads the
//! passage (a small model, a person, a big upstream model) sees when it happened.
//!
//! The expressions: yesterday, today, tonight, tomorrow, last night, this morning
//! (afternoon, evening); N days, weeks, months or years ago (N a number, or a word:
//! "a", "two", "a couple of", "a few"); N weekends ago; the other day; last, this or next
//! week, weekend, month or year, and "this past" week or weekend; last or next
//! Monday…Sunday (cut as "Fri" or "Tues" when capitalised); on Monday…Sunday (the one
//! before the turn's day, or the one after when the sentence speaks of what is to come:
//! "will", "'ll", "going", "gonna", "plan"); last, this or next January…December, and
//! spring, summer or fall (autumn); in January…December (the
//! nearest such month: at most six months either side of the turn). Dates are written
//! as LoCoMo and people write them: "7 May 2023", "May 2023", "2023", "the week before
//! 9 June 2023".
//!
//! Date arithmetic is chrono's; the phrases are matched here, word by word (the
//! maintained natural-date parsers read a whole string as one date, not expressions
//! inside running text).

use chrono::{Datelike, Duration, Months, NaiveDate, NaiveDateTime, Weekday};

use crate::passages::{is_turn, turn_time};

/// A relative expression found in a text, with what it resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// Byte range of the expression in the text.
    pub start: usize,
    pub end: usize,
    /// What it means, as a date or a span of dates ("7 May 2023", "April 2023").
    pub means: String,
}

/// A time as chat logs write it: `2023-05-08 13:56` (with or without seconds or a
/// trailing ` UTC`), RFC 3339, or a date alone.
pub fn parse_time(text: &str) -> Option<NaiveDateTime> {
    let t = text.trim().trim_end_matches(" UTC");
    if let Ok(d) = chrono::DateTime::parse_from_rfc3339(t) {
        return Some(d.naive_utc());
    }
    ["%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S"]
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(t, f).ok())
        .or_else(|| {
            NaiveDate::parse_from_str(t, "%Y-%m-%d")
                .ok()
                .and_then(|d| d.and_hms_opt(0, 0, 0))
        })
}

/// A date as people write it: "7 May 2023".
pub fn day(d: NaiveDate) -> String {
    format!("{} {}", d.day(), d.format("%B %Y"))
}

fn month(d: NaiveDate) -> String {
    d.format("%B %Y").to_string()
}

const MONTHS: [&str; 12] = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
];

const WEEKDAYS: [&str; 7] = [
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
];

/// Whether `word` names a month or a weekday (any case), whole or cut to its first
/// three or four letters as dates are written ("Aug 15th", "Sept", "Tue").
pub fn is_calendar_word(word: &str) -> bool {
    let word = word.to_lowercase();
    let cut = (3..=4).contains(&word.len());
    MONTHS
        .iter()
        .chain(&WEEKDAYS)
        .any(|name| *name == word || (cut && name.starts_with(word.as_str())))
}

/// The weekday `word` names: whole in any case, or cut as people write it after "last"
/// or "next" ("last Fri", "last Tues") when capitalised, so that "the last sun" stays
/// the sun.
fn weekday(word: &str, capitalised: bool) -> Option<Weekday> {
    let lower = word.to_lowercase();
    match lower.as_str() {
        whole if WEEKDAYS.contains(&whole) => lower.parse().ok(),
        _ if !capitalised => None,
        "tues" => Some(Weekday::Tue),
        "weds" => Some(Weekday::Wed),
        "thur" | "thurs" => Some(Weekday::Thu),
        _ if lower.len() == 3 => lower.parse().ok(),
        _ => None,
    }
}

/// A count as a number or a word; `None` for "a few" and "several" (not a number),
/// which the caller writes as a span.
fn count(word: &str) -> Option<Option<u32>> {
    let n = match word {
        "a" | "an" | "one" => 1,
        "two" | "couple" => 2,
        "three" => 3,
        "four" => 4,
        "five" => 5,
        "six" => 6,
        "seven" => 7,
        "eight" => 8,
        "nine" => 9,
        "ten" => 10,
        "few" | "several" => return Some(None),
        w => return w.parse().ok().filter(|&n| n > 0 && n < 100).map(Some),
    };
    Some(Some(n))
}

/// Words of `text`, lower-cased, with their byte ranges (letters and digits; an
/// apostrophe inside a word is kept).
fn words(text: &str) -> Vec<(usize, usize, String)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in text
        .char_indices()
        .chain(std::iter::once((text.len(), ' ')))
    {
        let inside = c.is_alphanumeric()
            || (c == '\'' && start.is_some() && text[i + 1..].starts_with(char::is_alphabetic));
        match (inside, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s, i, text[s..i].to_lowercase()));
                start = None;
            }
            _ => {}
        }
    }
    out
}

/// Whether `text` writes a date out: a month named beside a number ("December 27",
/// "9 June", "May 2023") or a year ("since 2018"). Such a turn says its own date; the
/// day it was said is not the answer to when.
pub fn names_a_date(text: &str) -> bool {
    let w = words(text);
    let number = |k: usize| {
        w.get(k)
            .is_some_and(|x| x.2.starts_with(|c: char| c.is_ascii_digit()))
    };
    (0..w.len()).any(|i| {
        let word = w[i].2.as_str();
        let year = word.len() == 4 && word.parse::<u32>().is_ok_and(|y| (1900..2100).contains(&y));
        year || (MONTHS.contains(&word) && (number(i + 1) || (i > 0 && number(i - 1))))
    })
}

/// The relative expressions of `text`, said at `at`, in order.
pub fn resolve(text: &str, at: NaiveDateTime) -> Vec<Resolved> {
    let now = at.date();
    let w = words(text);
    let mut out = Vec::new();
    let mut i = 0;
    while i < w.len() {
        let word = |k: usize| w.get(i + k).map_or("", |x| x.2.as_str());
        let capitalised = |k: usize| {
            w.get(i + k)
                .is_some_and(|x| text[x.0..].starts_with(char::is_uppercase))
        };
        let found: Option<(usize, String)> = match word(0) {
            "yesterday" => Some((1, day(now - Duration::days(1)))),
            "today" | "tonight" => Some((1, day(now))),
            "tomorrow" => Some((1, day(now + Duration::days(1)))),
            "last" if word(1) == "night" => Some((2, day(now - Duration::days(1)))),
            "this" if matches!(word(1), "morning" | "afternoon" | "evening") => Some((2, day(now))),
            // "this past weekend": the last one.
            "this" if word(1) == "past" => {
                relative("last", word(2), capitalised(2), now).map(|m| (3, m))
            }
            "the" if word(1) == "other" && word(2) == "day" => {
                Some((3, format!("a few days before {}", day(now))))
            }
            "last" | "this" | "next" => {
                relative(word(0), word(1), capitalised(1), now).map(|m| (2, m))
            }
            "in" => in_month(word(1), word(2), now).map(|m| (2, m)),
            "on" => weekday(word(1), capitalised(1))
                .and_then(|d| on_weekday(d, ahead(text, w[i].0), now))
                .map(|m| (2, m)),
            _ => ago(&w[i..], now),
        };
        match found {
            Some((n, means)) => {
                out.push(Resolved {
                    start: w[i].0,
                    end: w[i + n - 1].1,
                    means,
                });
                i += n;
            }
            None => i += 1,
        }
    }
    out
}

/// "last week", "next month", "this year", "last Sunday" (the day named with its
/// date: "Sunday 21 May 2023")…
fn relative(which: &str, unit: &str, capitalised: bool, now: NaiveDate) -> Option<String> {
    let step: i32 = match which {
        "last" => -1,
        "next" => 1,
        _ => 0,
    };
    let shift = |months: i32| match months.signum() {
        -1 => now.checked_sub_months(Months::new(months.unsigned_abs())),
        _ => now.checked_add_months(Months::new(months as u32)),
    };
    Some(match unit {
        "week" | "weekend" => match which {
            "last" => format!("the {unit} before {}", day(now)),
            "next" => format!("the {unit} after {}", day(now)),
            _ => format!("the {unit} of {}", day(now)),
        },
        "month" => month(shift(step)?),
        "year" => (now.year() + step).to_string(),
        // "May" and "March" only capitalised: "the last may be late".
        named if MONTHS.contains(&named) && (capitalised || !matches!(named, "may" | "march")) => {
            let m = MONTHS.iter().position(|&x| x == named)? as u32 + 1;
            let year = match step {
                -1 if m < now.month() => now.year(),
                -1 => now.year() - 1,
                1 if m > now.month() => now.year(),
                1 => now.year() + 1,
                _ => return in_month(named, "", now),
            };
            month(NaiveDate::from_ymd_opt(year, m, 1)?)
        }
        "spring" | "summer" | "fall" | "autumn" => {
            let (first, last) = match unit {
                "spring" => (3, 5),
                "summer" => (6, 8),
                _ => (9, 11),
            };
            let year = match step {
                -1 if now.month() > last => now.year(),
                -1 => now.year() - 1,
                1 if now.month() < first => now.year(),
                1 => now.year() + 1,
                _ => now.year(),
            };
            format!("{unit} {year}")
        }
        other => {
            let target = weekday(other, capitalised)?;
            let mut d = now;
            loop {
                d = match step {
                    1 => d.succ_opt()?,
                    0 => return None,
                    _ => d.pred_opt()?,
                };
                if d.weekday() == target {
                    break format!("{} {}", d.format("%A"), day(d));
                }
            }
        }
    })
}

/// The sentence of `text` holding the bytes `start..end`: from the last ".", "!", "?"
/// or line break before them to the first after them.
pub fn sentence_around(text: &str, start: usize, end: usize) -> &str {
    let from = text[..start]
        .rfind(['.', '!', '?', '\n'])
        .map_or(0, |i| i + 1);
    let to = text[end..]
        .find(['.', '!', '?', '\n'])
        .map_or(text.len(), |i| end + i);
    &text[from..to]
}

/// Whether the sentence of `text` around byte `at` speaks of what is to come: it holds
/// "will", a contracted "'ll" (or "’ll"), "going", "gonna" or a form of "plan".
fn ahead(text: &str, at: usize) -> bool {
    let w = words(sentence_around(text, at, at));
    w.iter().any(|(_, _, word)| {
        matches!(
            word.as_str(),
            "will" | "gonna" | "going" | "plan" | "plans" | "planning" | "ll"
        ) || word.ends_with("'ll")
    })
}

/// "on Friday": the Friday before the turn's day, or after it when `ahead`, with its
/// date ("Friday 8 March 2024").
fn on_weekday(target: Weekday, ahead: bool, now: NaiveDate) -> Option<String> {
    let mut d = now;
    loop {
        d = match ahead {
            true => d.succ_opt()?,
            false => d.pred_opt()?,
        };
        if d.weekday() == target {
            return Some(format!("{} {}", d.format("%A"), day(d)));
        }
    }
}

/// "in March" (not followed by a year): the March nearest the turn.
fn in_month(name: &str, next: &str, now: NaiveDate) -> Option<String> {
    let m = MONTHS.iter().position(|&x| x == name)? as i32 + 1;
    if next.len() == 4 && next.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let diff = m - now.month() as i32;
    let year = match diff {
        d if d > 6 => now.year() - 1,
        d if d < -6 => now.year() + 1,
        _ => now.year(),
    };
    Some(month(NaiveDate::from_ymd_opt(year, m as u32, 1)?))
}

/// "two days ago", "a couple of weeks ago", "a few months ago", "two weekends ago".
fn ago(w: &[(usize, usize, String)], now: NaiveDate) -> Option<(usize, String)> {
    let word = |k: usize| w.get(k).map_or("", |x| x.2.as_str());
    // "a couple of" / "a few": the count word is the second.
    let (n, skip) = match (word(0), word(1)) {
        ("a", "couple") if word(2) == "of" => (Some(2), 3),
        ("a", "couple") => (Some(2), 2),
        ("a", "few") => (None, 2),
        (first, _) => (count(first)?, 1),
    };
    let unit = word(skip).trim_end_matches('s');
    if word(skip + 1) != "ago" || !matches!(unit, "day" | "week" | "weekend" | "month" | "year") {
        return None;
    }
    let len = skip + 2;
    let Some(n) = n else {
        return Some((len, format!("a few {unit}s before {}", day(now))));
    };
    let means = match unit {
        "day" => day(now - Duration::days(n.into())),
        "week" => format!("the week of {}", day(now - Duration::weeks(n.into()))),
        // The weekend by its Saturday: the last one at least two days past (so that on
        // a Sunday it is the weekend before), then a week back for each more.
        "weekend" => {
            let mut saturday = now - Duration::days(2);
            while saturday.weekday() != Weekday::Sat {
                saturday = saturday.pred_opt()?;
            }
            let saturday = saturday - Duration::weeks(i64::from(n) - 1);
            format!("the weekend of {}", day(saturday))
        }
        "month" => month(now.checked_sub_months(Months::new(n))?),
        _ => (now.year() - n as i32).to_string(),
    };
    Some((len, means))
}

/// `text` with each relative expression followed by what it means in brackets.
pub fn annotate(text: &str, at: NaiveDateTime) -> String {
    let mut out = String::with_capacity(text.len() + 32);
    let mut from = 0;
    for r in resolve(text, at) {
        out.push_str(&text[from..r.end]);
        out.push_str(&format!(" [{}]", r.means));
        from = r.end;
    }
    out.push_str(&text[from..]);
    out
}

/// A passage with the relative dates of each chat turn resolved against the turn's own
/// time; `None` when nothing was resolved. A turn's lines after its first, and the lines
/// a passage starts with when it starts inside a turn, are that turn's words: they are
/// resolved against its time (`continued`, the time of the turn open where the passage
/// starts, for those). Text that is no timed turn's is left as it is.
pub fn dated(passage: &str, continued: Option<NaiveDateTime>) -> Option<String> {
    let mut changed = false;
    let mut at = continued;
    let lines: Vec<String> = passage
        .split_inclusive('\n')
        .map(|line| {
            // The words after the speaker: the time itself is not an expression.
            let body = match is_turn(line) {
                true => {
                    at = turn_time(line).and_then(parse_time);
                    line.find("] ").map_or(0, |i| i + 2)
                }
                false => 0,
            };
            let Some(at) = at else {
                return line.to_string();
            };
            let annotated = annotate(&line[body..], at);
            changed |= annotated.len() != line.len() - body;
            format!("{}{annotated}", &line[..body])
        })
        .collect();
    changed.then(|| lines.concat())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> NaiveDateTime {
        parse_time(text).unwrap()
    }

    fn means(text: &str, when: &str) -> Vec<String> {
        resolve(text, at(when))
            .into_iter()
            .map(|r| r.means)
            .collect()
    }

    #[test]
    fn each_expression_resolves_against_the_turn_time() {
        let may8 = "2023-05-08 13:56"; // a Monday
        assert_eq!(means("I went yesterday.", may8), ["7 May 2023"]);
        assert_eq!(
            means("Today and tomorrow", may8),
            ["8 May 2023", "9 May 2023"]
        );
        assert_eq!(means("last night", may8), ["7 May 2023"]);
        assert_eq!(means("Two days ago", may8), ["6 May 2023"]);
        assert_eq!(means("3 days ago", may8), ["5 May 2023"]);
        assert_eq!(means("last week", may8), ["the week before 8 May 2023"]);
        assert_eq!(means("next month", may8), ["June 2023"]);
        assert_eq!(means("last month", may8), ["April 2023"]);
        assert_eq!(means("last year", may8), ["2022"]);
        assert_eq!(
            means("a few days ago", may8),
            ["a few days before 8 May 2023"]
        );
        assert_eq!(means("a couple of months ago", may8), ["March 2023"]);
        assert_eq!(means("last Saturday", may8), ["Saturday 6 May 2023"]);
        assert_eq!(means("next Monday", may8), ["Monday 15 May 2023"]);
        assert_eq!(means("in March", may8), ["March 2023"]);
        // The nearest December is the one before.
        assert_eq!(means("in December", may8), ["December 2022"]);
        // A month with its year is already a date; a plain "last" is not a date.
        assert!(means("in March 2021", may8).is_empty());
        assert!(means("the last time we met", may8).is_empty());
        assert!(means("days ago I said", may8).is_empty());
    }

    #[test]
    fn weekdays_cut_weekends_counted_and_other_ways_of_saying_it() {
        let mar11 = "2024-03-11 14:31"; // a Monday
        assert_eq!(means("last Fri", mar11), ["Friday 8 March 2024"]);
        assert_eq!(means("joined last Tues.", mar11), ["Tuesday 5 March 2024"]);
        assert_eq!(means("next Thurs", mar11), ["Thursday 14 March 2024"]);
        assert_eq!(means("last Sat", mar11), ["Saturday 9 March 2024"]);
        // A cut weekday counts only capitalised: "the last sun" is the sun.
        assert!(means("we saw the last sun of summer", mar11).is_empty());
        assert!(means("at last sat down", mar11).is_empty());
        assert_eq!(
            means("this past weekend", mar11),
            ["the weekend before 11 March 2024"]
        );
        assert_eq!(
            means("two weekends ago", mar11),
            ["the weekend of 2 March 2024"]
        );
        assert_eq!(
            means("a weekend ago", mar11),
            ["the weekend of 9 March 2024"]
        );
        // Said on a Sunday, the weekend before is the one of eight days past.
        assert_eq!(
            means("a weekend ago", "2024-03-10 10:00"),
            ["the weekend of 2 March 2024"]
        );
        assert_eq!(means("a couple days ago", mar11), ["9 March 2024"]);
        assert_eq!(
            means("I saw her the other day", mar11),
            ["a few days before 11 March 2024"]
        );
        assert!(means("the other side of the day", mar11).is_empty());
    }

    #[test]
    fn named_months_seasons_and_a_weekday_after_on() {
        let dec = "2023-12-06 10:00"; // a Wednesday
        assert_eq!(means("Last August I ran a stall.", dec), ["August 2023"]);
        assert_eq!(means("last december", dec), ["December 2022"]);
        assert_eq!(means("next March", dec), ["March 2024"]);
        assert_eq!(means("We met last summer.", dec), ["summer 2023"]);
        assert_eq!(means("this fall", dec), ["fall 2023"]);
        assert_eq!(means("next spring", dec), ["spring 2024"]);
        let july = "2023-07-10 09:00"; // a Monday, in summer
        assert_eq!(means("last summer", july), ["summer 2022"]);
        // "may" and "march" name months only capitalised.
        assert!(means("the last may be late, the last march is long", july).is_empty());
        // A weekday after "on": the one before, unless the sentence looks ahead.
        assert_eq!(
            means("On Friday, I got great news.", july),
            ["Friday 7 July 2023"]
        );
        assert_eq!(
            means("I got news. I’ll fly out on Friday!", july),
            ["Friday 14 July 2023"]
        );
        assert_eq!(
            means("We're going to the lake on Sat.", july),
            ["Saturday 15 July 2023"]
        );
        assert!(means("He sat on sat cushions.", july).is_empty());
    }

    #[test]
    fn month_and_year_boundaries() {
        assert_eq!(means("yesterday", "2023-03-01 09:00"), ["28 February 2023"]);
        assert_eq!(means("yesterday", "2024-03-01 09:00"), ["29 February 2024"]);
        assert_eq!(means("tomorrow", "2023-12-31 23:59"), ["1 January 2024"]);
        assert_eq!(means("last month", "2023-01-15 10:00"), ["December 2022"]);
        assert_eq!(means("next month", "2023-12-15 10:00"), ["January 2024"]);
        assert_eq!(means("in January", "2023-11-20 10:00"), ["January 2024"]);
        assert_eq!(
            means("last Sunday", "2023-01-01 10:00"),
            ["Sunday 25 December 2022"]
        );
    }

    #[test]
    fn months_and_weekdays_are_calendar_words_whole_or_cut() {
        for word in [
            "May", "august", "Aug", "Sept", "Dec", "Tue", "Thur", "Sunday",
        ] {
            assert!(is_calendar_word(word), "{word}");
        }
        for word in ["Augustine", "Mayor", "Frida", "Ma", "Kofi", "Au"] {
            assert!(!is_calendar_word(word), "{word}");
        }
    }

    #[test]
    fn dates_written_out_are_told_from_words_that_look_like_them() {
        assert!(names_a_date("Kofi's birthday is December 27."));
        assert!(names_a_date("It's on the 9th of June... 9 June, I mean."));
        assert!(names_a_date("We moved in May 2023."));
        assert!(names_a_date("I've been surfing since 2018."));
        assert!(!names_a_date("I may go in a bit."));
        assert!(!names_a_date("I went to the aquarium yesterday."));
        assert!(!names_a_date("Room 4411 at 10:30."));
    }

    #[test]
    fn turns_are_dated_by_their_own_time_and_untimed_text_is_left_alone() {
        let passage = "[2023-05-08 13:56] user (Ana): I went to the climbing gym yesterday.\n\
                       [2023-05-25 13:14] user (Ravi): I ran a half marathon last Sunday.\n\
                       user (Rav): Yesterday was fun.\n";
        let shown = dated(passage, None).unwrap();
        assert!(
            shown.contains("climbing gym yesterday [7 May 2023]."),
            "{shown}"
        );
        assert!(
            shown.contains("last Sunday [Sunday 21 May 2023]."),
            "{shown}"
        );
        assert!(
            shown.contains("user (Rav): Yesterday was fun.\n"),
            "{shown}"
        );
        assert!(shown.starts_with("[2023-05-08 13:56] user (Ana): "));
        assert_eq!(dated("[2023-05-08 13:56] user: Hello there.\n", None), None);
        assert_eq!(
            dated("Yesterday, in a document without a time.", None),
            None
        );
        assert_eq!(
            annotate("Yesterday.", at("2023-05-08T13:56:00Z")),
            "Yesterday [7 May 2023]."
        );
    }

    #[test]
    fn a_turn_s_later_lines_and_a_passage_starting_inside_a_turn_take_its_time() {
        // A passage cut inside a turn said on Monday 11 March 2024: its first line is that
        // turn's words, then a turn of two lines.
        let passage = "dinner was great. Something odd happened last Friday.\n\
                       [2024-03-12 09:00] user (Ben): What happened?\n\
                       I was away until yesterday.\n";
        let monday = Some(at("2024-03-11 18:02"));
        let shown = dated(passage, monday).unwrap();
        assert!(
            shown.starts_with(
                "dinner was great. Something odd happened last Friday [Friday 8 March 2024]."
            ),
            "{shown}"
        );
        assert!(
            shown.ends_with("I was away until yesterday [11 March 2024].\n"),
            "{shown}"
        );
        // Without the time of the turn it starts in, its first line is left alone.
        let shown = dated(passage, None).unwrap();
        assert!(shown.starts_with("dinner was great. Something odd happened last Friday.\n"));
    }
}
