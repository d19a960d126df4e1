//! `memctl bench qa` on a conversation of our own JSON Lines: the direct baseline reads
//! the whole conversation when it fits the context, in one model call, the search
//! mode reports its recall at each depth and the passages it found, over the questions
//! whose evidence names turns of the chat, and the answers the passages and turns they
//! cite.

use super::{stderr, with_model};

#[test]
fn the_direct_baseline_reads_a_short_conversation_whole() {
    let dir = std::env::temp_dir().join(format!("memctl-qa-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let data = dir.join("trip.jsonl");
    let turns = [
        ("t1", "Ana", "I flew to Rome yesterday.", "14:02"),
        ("t2", "Ben", "Nice! I stayed home and baked bread.", "14:03"),
        ("t3", "Ana", "The Colosseum was my favourite part.", "14:05"),
    ];
    let mut lines: Vec<String> = turns
        .iter()
        .map(|(id, name, content, time)| {
            serde_json::json!({"conversation": "trip", "id": id, "name": name,
                "content": content, "timestamp": format!("2023-05-11 {time}")})
            .to_string()
        })
        .collect();
    lines.push(
        serde_json::json!({"conversation": "trip", "question": "What did Ben bake?",
            "answer": "bread", "evidence": ["t2"], "category": "single-hop"})
        .to_string(),
    );
    // Evidence naming two turns in one entry, and evidence naming no turn of the chat.
    lines.push(
        serde_json::json!({"conversation": "trip", "question": "Where did Ana fly, and what did she like?",
            "answer": "Rome, the Colosseum", "evidence": ["t1; t3"], "category": "multi-hop"})
        .to_string(),
    );
    lines.push(
        serde_json::json!({"conversation": "trip", "question": "What did Ben drink?",
            "answer": "tea", "evidence": ["t9"], "category": "single-hop"})
        .to_string(),
    );
    std::fs::write(&data, lines.join("\n") + "\n").unwrap();
    let out = dir.join("out");
    let run = with_model(&[
        "bench",
        "qa",
        "--data",
        data.to_str().unwrap(),
        "--modes",
        "direct,search,evidence",
        "--no-memory",
        "--rerank",
        "3",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
    let records: Vec<serde_json::Value> = std::fs::read_to_string(out.join("results.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        stderr(&run).contains("evidence `t9` names no turn of the conversation"),
        "{}",
        stderr(&run)
    );
    let direct = records.iter().find(|r| r["mode"] == "direct").unwrap();
    assert_eq!(direct["model_calls"], 1, "{direct}");
    assert_eq!(direct["turns_read"], serde_json::json!(["t1", "t2", "t3"]));
    assert_eq!(direct["evidence_recall"], 1.0);
    assert!(!direct["answer"].as_str().unwrap().is_empty());
    let search = records.iter().find(|r| r["mode"] == "search").unwrap();
    assert_eq!(search["recall_at"].as_array().unwrap().len(), 3, "{search}");
    let both = records
        .iter()
        .find(|r| r["mode"] == "search" && r["category"] == "multi-hop")
        .unwrap();
    assert_eq!(both["evidence"], serde_json::json!(["t1", "t3"]), "{both}");
    // A question with no evidence turn in its chat has no recall of its own, and the
    // search's figures count the other two.
    let none = records
        .iter()
        .find(|r| r["mode"] == "search" && r["question"] == "What did Ben drink?")
        .unwrap();
    assert!(none.get("recall_at").is_none(), "{none}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let overall = &summary["results"]["search"]["overall"];
    assert_eq!(overall["with_evidence"], 2, "{overall}");
    // The passages found, with their turns and scores (the likelihood too, ranked
    // again), for measures without a second run.
    let found = search["found"].as_array().unwrap();
    assert!(found.iter().any(|f| f["turns"]
        .as_array()
        .unwrap()
        .contains(&serde_json::json!("t2"))));
    assert!(
        found.iter().all(|f| f["score"].as_f64().unwrap() > 0.0),
        "{search}"
    );
    assert!(
        found
            .iter()
            .all(|f| f["likelihood"].as_f64().unwrap() < 0.0),
        "{search}"
    );

    // An answer cites the passage it read and, in it, the turn it read from.
    let baked = records
        .iter()
        .find(|r| r["mode"] == "evidence" && r["question"] == "What did Ben bake?")
        .unwrap();
    assert_eq!(
        baked["passages_cited"],
        serde_json::json!(["t1", "t2", "t3"]),
        "{baked}"
    );
    assert_eq!(baked["turns_cited"], serde_json::json!(["t2"]), "{baked}");
    let cited = &summary["results"]["evidence"]["overall"];
    assert_eq!(cited["citing"], 2, "{cited}");
    assert_eq!(cited["cited_passage_evidence"], 1.0, "{cited}");
    assert!(
        cited["cited_turn_evidence"].as_f64().unwrap() >= 0.5,
        "{cited}"
    );

    let bad = with_model(&[
        "bench",
        "qa",
        "--data",
        data.to_str().unwrap(),
        "--modes",
        "whole",
    ]);
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("expected evidence, memory, search or direct"),
        "{}",
        stderr(&bad)
    );
}
