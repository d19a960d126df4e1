//! Streams stepped together in one batch get exactly the memories each gets alone: the
//! daemon reads three files at once, `memctl ingest` reads each into a database of its
//! own, and every version's text agrees.

use std::time::Duration;

use memagent_store::{Store, GENERAL};

use crate::{model_path, stderr, test_root, Daemon};

const FACTS: [&str; 6] = [
    "Ada keeps bees behind the old mill.",
    "The ferry leaves at dawn and returns after dark.",
    "Our team chose the blue logo after a long debate.",
    "Ingrid moved to Porto in March.",
    "The harbour office opens on 14 May at 9 am.",
    "Nobody remembers who planted the walnut tree.",
];

fn texts(store: &Store, name: &str) -> Vec<String> {
    let stream = store.require(name).unwrap();
    store
        .versions(&stream, GENERAL)
        .unwrap()
        .into_iter()
        .map(|v| v.text)
        .collect()
}

#[test]
fn streams_stepped_in_a_batch_remember_what_each_remembers_alone() {
    let root = test_root("batch");
    let watched = root.join("watched");
    std::fs::create_dir_all(&watched).unwrap();
    let streams = ["bees", "ferry", "logo"];
    let mut config = String::new();
    for (i, name) in streams.iter().enumerate() {
        // Different lengths, so the streams' steps end at different times.
        let text: Vec<&str> = FACTS
            .iter()
            .cycle()
            .skip(i * 2)
            .take(6 + 5 * i)
            .copied()
            .collect();
        let file = watched.join(format!("{name}.txt"));
        std::fs::write(&file, text.join("\n") + "\n").unwrap();
        config.push_str(&format!(
            "[[watch]]\npath = \"{}\"\nstream = \"{name}\"\n",
            file.display()
        ));
    }
    let settings = ["--chunk-tokens", "64", "--memory-tokens", "24"];
    let mut daemon = Daemon::start(
        &root,
        &config,
        &[&["--idle-seconds", "0.5"][..], &settings[..]].concat(),
    );
    for name in streams {
        let bytes = std::fs::metadata(watched.join(format!("{name}.txt")))
            .unwrap()
            .len();
        daemon.wait_caught_up(name, bytes, Duration::from_secs(300));
    }
    assert!(daemon.stop().success());
    assert!(
        daemon.log_text().contains("streams in one batch"),
        "the streams were stepped together:\n{}",
        daemon.log_text()
    );
    let together = Store::open(&daemon.data).unwrap();

    for name in streams {
        let alone_dir = root.join(format!("alone-{name}"));
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_memctl"))
            .arg("--model")
            .arg(model_path())
            .arg("--data-dir")
            .arg(&alone_dir)
            .args(["ingest", name])
            .arg(watched.join(format!("{name}.txt")))
            .args(settings)
            .env_remove("MEMAGENT_MODEL")
            .env_remove("MEMAGENT_CONFIG")
            .env("XDG_CONFIG_HOME", root.join("no-config"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let alone = Store::open(&alone_dir).unwrap();
        let (a, b) = (texts(&together, name), texts(&alone, name));
        assert!(a.len() >= 2, "{name}: {} versions", a.len());
        assert_eq!(a, b, "{name}: memories differ between the batch and alone");
    }
}
