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
    padded_sittings(&sittings)
}

/// Three sittings of a chat in chat-jsonl: Ana bakes a lemon cake for Ben's party in the
/// first, rye bread for an office party in the third (in as many words of "What did Ana
/// bake for Ben's party?"), the second is about fencing.
pub fn sittings_about_baking() -> String {
    let sittings: [(&str, [(&str, &str); 2]); 3] = [
        (
            "2024-03-02",
            [
                (
                    "Ben",
                    "Thanks for coming to my party, Ana! Everyone loved what you baked for the party.",
                ),
                (
                    "Ana",
                    "Happy to! I baked the lemon cake for your party myself, Ben.",
                ),
            ],
        ),
        (
            "2024-03-09",
            [
                ("Ben", "How was the fencing club this week?"),
                ("Ana", "Tiring. We drilled parries for two hours."),
            ],
        ),
        (
            "2024-03-16",
            [
                ("Ben", "Are you coming to the office party on Friday, Ana?"),
                ("Ana", "Yes, and I baked rye bread for the party, Ben."),
            ],
        ),
    ];
    padded_sittings(&sittings)
}

/// Three sittings of a chat in chat-jsonl: Ana names her pets in the first and again, in
/// the same sentence, in the third; the second is about the cello.
pub fn sittings_about_pets() -> String {
    let pets = "My pets are a dog named Rex and a cat named Mochi.";
    let sittings: [(&str, [(&str, String); 2]); 3] = [
        (
            "2024-04-01",
            [
                ("Ben", "Do you have pets, Ana?".to_string()),
                ("Ana", format!("Sure do! {pets}")),
            ],
        ),
        (
            "2024-04-08",
            [
                ("Ben", "How was the cello lesson?".to_string()),
                ("Ana", "Long. We played scales for an hour.".to_string()),
            ],
        ),
        (
            "2024-04-15",
            [
                ("Ben", "Tell Carla about your pets, Ana.".to_string()),
                ("Ana", format!("Gladly! {pets}")),
            ],
        ),
    ];
    let sittings: Vec<(&str, [(&str, &str); 2])> = sittings
        .iter()
        .map(|(day, [a, b])| (*day, [(a.0, a.1.as_str()), (b.0, b.1.as_str())]))
        .collect();
    padded_sittings(&sittings)
}

/// Each sitting (its day, its two opening turns) followed by the same small talk, a turn a
/// minute from 10:00: about 90 words of talk, so that each sitting's opening lies in
/// passages of its own.
fn padded_sittings(sittings: &[(&str, [(&str, &str); 2])]) -> String {
    let small_talk = [
        "Did you see the rain this morning? It came down in sheets for an hour.",
        "I did, the street outside turned into a little river and the buses were all late.",
        "My umbrella gave up halfway to the station, so I arrived soaked and grumpy.",
        "At least the weekend forecast looks dry, maybe we can walk along the river then.",
        "That sounds good, we could stop for coffee at the place near the bridge.",
        "Their cakes are great too, the lemon one especially, I always order it.",
    ];
    let mut log = String::new();
    for (day, opening) in sittings {
        let talk = small_talk
            .iter()
            .enumerate()
            .map(|(i, words)| (["Ben", "Ana"][i % 2], *words));
        for (minute, (name, words)) in opening.iter().copied().chain(talk).enumerate() {
            log.push_str(&chat_line(name, words, &format!("{day} 10:{minute:02}")));
        }
    }
    log
}
