//! A conversation log written turn by turn: a fact from an early turn is answered after
//! the small talk that follows, from the memory and the passages found for the question.

use std::time::Duration;

use memagent_store::{Store, GENERAL};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::{append, test_root, Daemon};

const SMALL_TALK: &[(&str, &str)] = &[
    ("user", "Good morning! The weather looks grey again today."),
    (
        "assistant",
        "Good morning. Grey skies are common this time of year.",
    ),
    ("user", "I watched a documentary about whales last night."),
    (
        "assistant",
        "Whales are remarkable; some species sing for hours.",
    ),
    ("user", "Can you suggest a quick lunch idea?"),
    (
        "assistant",
        "A tomato and bean soup takes about twenty minutes.",
    ),
    ("user", "The neighbours are painting their fence blue."),
    (
        "assistant",
        "Blue fences can look lovely against a green garden.",
    ),
    ("user", "I need to remember to water the plants."),
    (
        "assistant",
        "Watering in the evening keeps more of the water in the soil.",
    ),
    ("user", "My train was late again this morning."),
    (
        "assistant",
        "That is frustrating; delays seem frequent lately.",
    ),
    ("user", "What is a good book for a rainy weekend?"),
    (
        "assistant",
        "A long mystery novel suits a rainy weekend well.",
    ),
    ("user", "I tried a new coffee shop near the station."),
    ("assistant", "Was the coffee good there?"),
];

/// Seeds of the conversations. Whether the 135M model's memory keeps the fact depends
/// on the seed and on the machine's float rounding (seeds 2 and 3 on a Zen 4, only 3 on
/// an AVX-512 Xeon); it is printed, not asserted. What every seed must do is answer the
/// question, since the passage that states the fact is found for it.
/// `MEMAGENT_CHAT_SEEDS=1,2,…` runs other seeds.
const PINNED: &[u64] = &[2, 3];

/// The messages of one conversation: the fact in the second user turn, then small talk.
fn conversation(seed: u64) -> Vec<serde_json::Value> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut messages = vec![
        json!({"role": "user", "content": "Hello! I just moved to a new flat.", "timestamp": "2026-11-20 09:15"}),
        json!({"role": "assistant", "content": "Congratulations on the move!"}),
        json!({"role": "user", "name": "Priya", "content": [
            {"type": "text", "text": "Please remember this: my sister Lucia lives in Porto."}
        ]}),
        json!({"role": "assistant", "content": "Noted: your sister Lucia lives in Porto."}),
    ];
    for _ in 0..46 {
        let (role, text) = SMALL_TALK[rng.random_range(0..SMALL_TALK.len())];
        messages.push(json!({"role": role, "content": text}));
    }
    messages
}

/// The turns as the daemon renders them.
fn rendered(messages: &[serde_json::Value]) -> String {
    messages
        .iter()
        .map(|m| {
            let content = match &m["content"] {
                serde_json::Value::String(s) => s.clone(),
                parts => parts[0]["text"].as_str().unwrap().to_string(),
            };
            let time = m["timestamp"]
                .as_str()
                .map_or(String::new(), |t| format!("[{t}] "));
            let name = m["name"]
                .as_str()
                .map_or(String::new(), |n| format!(" ({n})"));
            format!("{time}{}{name}: {content}\n", m["role"].as_str().unwrap())
        })
        .collect()
}

#[test]
fn a_chat_log_written_turn_by_turn_keeps_an_early_fact() {
    let seeds: Vec<u64> = match std::env::var("MEMAGENT_CHAT_SEEDS").ok() {
        Some(list) => list.split(',').map(|s| s.trim().parse().unwrap()).collect(),
        None => PINNED.to_vec(),
    };
    let root = test_root("chat");
    let chats = root.join("chats");
    std::fs::create_dir_all(&chats).unwrap();
    let config = format!(
        "[[watch]]\npath = \"{}\"\ninclude = [\"*.jsonl\"]\n",
        chats.display()
    );
    let mut daemon = Daemon::start(
        &root,
        &config,
        &["--idle-seconds", "1", "--chunk-tokens", "256"],
    );
    let conversations: Vec<_> = seeds.iter().map(|&s| (s, conversation(s))).collect();
    // Turn by turn, each line in two writes (the daemon must wait for the line's end);
    // a malformed line in the middle is skipped.
    for turn in 0..conversations[0].1.len() {
        for (seed, messages) in &conversations {
            let path = chats.join(format!("chat-{seed}.jsonl"));
            let line = format!("{}\n", messages[turn]);
            let (a, b) = line.split_at(line.len() / 2);
            append(&path, a);
            append(&path, b);
            if turn == 5 {
                append(&path, "{\"role\": \"user\", \"content\": \n");
            }
        }
    }
    let mut kept = Vec::new();
    for (seed, messages) in &conversations {
        let stream = format!("chat-{seed}.jsonl");
        let expected = rendered(messages);
        // One engine thread reads every conversation: the deadline grows with their number.
        let within = Duration::from_secs(150 * conversations.len().max(2) as u64);
        daemon.wait_caught_up(&stream, expected.len() as u64, within);
        let show = daemon.memctl(&["memory", "show", &stream]);
        let memory = String::from_utf8_lossy(&show.stdout).into_owned();
        let hit = memory.contains("Lucia") && memory.contains("Porto");
        eprintln!(
            "seed {seed}: {}\n{memory}",
            if hit { "kept" } else { "lost" }
        );
        if hit {
            kept.push(*seed);
        }
        let query = daemon.memctl(&[
            "query",
            &stream,
            "Where does my sister Lucia live?",
            "--json",
        ]);
        assert!(
            query.status.success(),
            "{}",
            String::from_utf8_lossy(&query.stderr)
        );
        let answer: serde_json::Value = serde_json::from_slice(&query.stdout).unwrap();
        let passages = answer["passages"].as_array().unwrap();
        assert!(
            passages.iter().any(|p| p["cited"] == true
                && p["text"].as_str().unwrap().contains("Lucia lives in Porto")
                && p["source"].as_str().unwrap().ends_with(&stream)
                // Short turns share a passage: it starts at the first turn, line 1.
                && p["line"] == 1
                && p["time"] == "2026-11-20 09:15"),
            "the passage stating the fact is cited with its file and line: {answer:#}"
        );
        assert!(
            answer["answer"].as_str().unwrap().contains("Porto"),
            "seed {seed}: {answer:#}"
        );
    }
    let log = daemon.log_text();
    assert!(
        log.contains(&format!("chat-{}.jsonl:7: not JSON", seeds[0])),
        "a malformed line is logged with file and line:\n{log}"
    );
    assert!(daemon.stop().success());

    // The logs hold exactly the rendered turns, and each chain read them in order.
    let store = Store::open(&root.join("data")).unwrap();
    for (seed, messages) in &conversations {
        let stream = store.require(&format!("chat-{seed}.jsonl")).unwrap();
        let log = store.read_log(&stream, 0, stream.log_len).unwrap();
        assert_eq!(String::from_utf8(log).unwrap(), rendered(messages));
        let versions = store.versions(&stream, GENERAL).unwrap();
        assert!(versions.len() >= 3, "several steps: {}", versions.len());
    }
    eprintln!(
        "kept the fact in {} of {} conversations (seeds kept: {kept:?})",
        kept.len(),
        seeds.len()
    );
}
