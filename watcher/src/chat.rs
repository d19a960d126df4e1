//! Conversation logs: JSON Lines with one OpenAI-style message per line, rendered as
//! turns ("user: …").

use serde_json::Value;

/// What the complete lines of a chat log's new bytes hold.
#[derive(Debug, Default, PartialEq)]
pub struct Parsed {
    /// The turns, one per message, each ending in a newline.
    pub text: String,
    /// Bytes consumed: through the last complete line; a partial last line waits.
    pub consumed: usize,
    /// Lines consumed.
    pub lines: u64,
    /// Lines that are not messages: (line number, reason). They are skipped.
    pub errors: Vec<(u64, String)>,
    /// Each turn's offset in `text` with its line number in the file.
    pub turns: Vec<(u64, u64)>,
}

/// Parses the complete lines of `bytes`, whose first line is line `first_line + 1` of
/// the file.
pub fn parse(bytes: &[u8], first_line: u64) -> Parsed {
    let mut out = Parsed::default();
    let Some(last_newline) = bytes.iter().rposition(|&b| b == b'\n') else {
        return out;
    };
    out.consumed = last_newline + 1;
    for (i, line) in bytes[..last_newline].split(|&b| b == b'\n').enumerate() {
        let number = first_line + i as u64 + 1;
        out.lines += 1;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match render(line) {
            Ok(turn) => {
                out.turns.push((out.text.len() as u64, number));
                out.text.push_str(&turn);
                out.text.push('\n');
            }
            Err(reason) => out.errors.push((number, reason)),
        }
    }
    out
}

/// One message as a turn: `[time] role (name): content`.
fn render(line: &[u8]) -> Result<String, String> {
    let value: Value = serde_json::from_slice(line).map_err(|e| format!("not JSON ({e})"))?;
    render_message(&value)
}

/// One OpenAI-style message (`{"role", "content", "name"?, "timestamp"?}`) as the turn a
/// chat log's line becomes: `[time] role (name): content`, without the newline; or why it
/// is not a message.
pub fn render_message(value: &Value) -> Result<String, String> {
    let Value::Object(message) = value else {
        return Err("not a JSON object; expected {\"role\": …, \"content\": …}".into());
    };
    let role = match message.get("role") {
        Some(Value::String(role)) if !role.is_empty() => role.as_str(),
        Some(_) => return Err("`role` is not a non-empty string".into()),
        None => return Err("no `role` field".into()),
    };
    let content = match message.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::new();
            for (i, part) in parts.iter().enumerate() {
                match part {
                    Value::String(text) => texts.push(text.clone()),
                    Value::Object(p) => match (p.get("text"), p.get("type")) {
                        (Some(Value::String(text)), _) => texts.push(text.clone()),
                        (_, Some(Value::String(kind))) => texts.push(format!("[{kind}]")),
                        _ => return Err(format!("`content[{i}]` has no `text`")),
                    },
                    _ => return Err(format!("`content[{i}]` is not a text part")),
                }
            }
            texts.join("\n")
        }
        // Assistant messages that only call tools carry no content.
        Some(Value::Null) => String::new(),
        Some(_) => return Err("`content` is neither a string nor a list of parts".into()),
        None => return Err("no `content` field".into()),
    };
    let mut turn = String::new();
    if let Some(time) = ["timestamp", "time", "created_at", "created", "ts"]
        .iter()
        .find_map(|key| message.get(*key).and_then(time_text))
    {
        turn.push_str(&format!("[{time}] "));
    }
    turn.push_str(role);
    if let Some(Value::String(name)) = message.get("name") {
        turn.push_str(&format!(" ({name})"));
    }
    turn.push_str(": ");
    turn.push_str(content.trim_end());
    Ok(turn)
}

/// A timestamp as written: strings as they are, numbers (Unix seconds, or milliseconds)
/// as UTC date and time.
fn time_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => {
            let mut secs = n.as_f64()?;
            if secs > 1e11 {
                secs /= 1000.0;
            }
            Some(utc(secs as i64))
        }
        _ => None,
    }
}

/// `YYYY-MM-DD HH:MM UTC` of Unix seconds (the proleptic Gregorian calendar).
pub fn utc(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_and_parts_content_with_name_and_time() {
        let log = concat!(
            r#"{"role":"user","name":"Priya","content":"I drink oat milk.","timestamp":"2026-11-20 09:15"}"#,
            "\n",
            r#"{"role":"assistant","content":[{"type":"text","text":"Noted."},{"type":"image_url","image_url":{"url":"x"}}]}"#,
            "\n",
            r#"{"role":"user","content":"hi","ts":1763630100}"#,
            "\n",
        );
        let parsed = parse(log.as_bytes(), 0);
        assert_eq!(
            parsed.text,
            "[2026-11-20 09:15] user (Priya): I drink oat milk.\n\
             assistant: Noted.\n[image_url]\n\
             [2025-11-20 09:15 UTC] user: hi\n"
        );
        assert_eq!(parsed.consumed, log.len());
        assert_eq!(parsed.lines, 3);
        assert!(parsed.errors.is_empty());
    }

    #[test]
    fn partial_last_line_waits() {
        let log = "{\"role\":\"user\",\"content\":\"a\"}\n{\"role\":\"user\",\"con";
        let parsed = parse(log.as_bytes(), 0);
        assert_eq!(parsed.text, "user: a\n");
        assert_eq!(parsed.consumed, log.find('\n').unwrap() + 1);
        assert_eq!(parse(b"{\"role\":", 0), Parsed::default());
    }

    #[test]
    fn malformed_lines_are_named_and_skipped() {
        let log = "{\"role\":\"user\",\"content\":\"a\"}\nnot json\n\n[1]\n{\"content\":\"x\"}\n\
                   {\"role\":\"user\",\"content\":5}\n{\"role\":\"user\",\"content\":\"b\"}\n";
        let parsed = parse(log.as_bytes(), 10);
        assert_eq!(parsed.text, "user: a\nuser: b\n");
        let lines: Vec<u64> = parsed.errors.iter().map(|(n, _)| *n).collect();
        assert_eq!(lines, [12, 14, 15, 16]);
        assert!(
            parsed.errors[0].1.starts_with("not JSON"),
            "{:?}",
            parsed.errors
        );
        assert_eq!(parsed.errors[2].1, "no `role` field");
        assert_eq!(parsed.lines, 7);
    }

    #[test]
    fn dates_from_unix_seconds() {
        assert_eq!(utc(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00 UTC");
        assert_eq!(utc(1_795_000_000), "2026-11-18 11:06 UTC");
    }
}
