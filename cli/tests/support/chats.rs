//! Chat logs the tests ingest, in chat-jsonl. Shared by the store and daemon tests, each
//! using what it needs.
#![allow(dead_code)]

/// One turn of a chat log in chat-jsonl form, with its line's end.
pub fn chat_line(name: &str, content: &str, time: &str) -> String {
    let line = serde_json::json!({
        "role": "user", "name": name, "content": content, "timestamp": time,
    });
    format!("{line}\n")
}

/// Four sittings of a chat in chat-jsonl: the first asks about bees, the third says
/// where Ana keeps her hives, the others are small talk.
pub fn sittings_about_bees() -> String {
    let small_talk = [
        "Did you see the rain this morning? It came down in sheets for an hour.",
        "I did, the street outside turned into a little river and the buses were all late.",
        "My umbrella gave up halfway to the station, so I arrived soaked and grumpy.",
        "At least the weekend forecast looks dry, maybe we can walk along the river then.",
        "That sounds good, we could stop for coffee at the place near the bridge.",
        "Their cakes are great too, the lemon one especially, I always order it.",
    ];
    let sittings: [(&str, [(&str, &str); 2]); 4] = [
        (
            "2024-03-02",
            [
                (
                    "Ana",
                    "Ben, do you keep bees? I read that bees keep warm in winter.",
                ),
                (
                    "Ben",
                    "No, I never kept bees. Bees keep away from me, honestly.",
                ),
            ],
        ),
        (
            "2024-03-09",
            [
                ("Ben", "How was the fencing club this week?"),
                (
                    "Ana",
                    "Tiring. We drilled parries for two hours and my arm aches.",
                ),
            ],
        ),
        (
            "2024-03-16",
            [
                (
                    "Ana",
                    "Guess what, I keep two hives on the roof of my flat in Porto now!",
                ),
                ("Ben", "Wow, how are the colonies settling in up there?"),
            ],
        ),
        (
            "2024-03-23",
            [
                ("Ben", "I started a pottery class on Tuesdays."),
                ("Ana", "Nice! Bring me a bowl when you have one."),
            ],
        ),
    ];
    let mut log = String::new();
    for (day, opening) in sittings {
        let talk = small_talk
            .iter()
            .enumerate()
            .map(|(i, words)| (["Ben", "Ana"][i % 2], *words));
        for (minute, (name, words)) in opening.into_iter().chain(talk).enumerate() {
            log.push_str(&chat_line(name, words, &format!("{day} 10:{minute:02}")));
        }
    }
    log
}
