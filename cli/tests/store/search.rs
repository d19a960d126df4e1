//! Recall beside memory, through `memctl`: passages found by words and by meaning with
//! their provenance, chat logs ingested as turns, `streams rm`, a database from before
//! the index, rebuilds equal to incremental indexing, and answers within their budget.

use std::path::Path;

use serde_json::Value;

use crate::chats::{chat_line, sittings_about_baking, sittings_about_bees, sittings_about_pets};
use crate::{data_dir, run, stderr};

fn json(o: &std::process::Output) -> Value {
    assert!(o.status.success(), "{}", stderr(o));
    serde_json::from_slice(&o.stdout).expect("JSON output")
}

fn search(dir: &Path, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["search", "--json"];
    all.extend_from_slice(args);
    json(&run(dir, &all))["passages"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// `log` (chat-jsonl) ingested as the stream `talk`, without memory steps.
fn ingest_talk(dir: &Path, log: &str) {
    let file = dir.join("talk.jsonl");
    std::fs::write(&file, log).unwrap();
    let o = run(
        dir,
        &["ingest", "talk", file.to_str().unwrap(), "--no-process"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
}

/// `memctl query talk QUESTION --json` answered by a loopback server that speaks the
/// OpenAI protocol (the stand-in for a served model), replying `reply(prompt)` to each
/// prompt: the answer, and every prompt it was asked.
fn query_stand_in(dir: &Path, question: &str, reply: fn(&str) -> String) -> (Value, Vec<String>) {
    use std::sync::{Arc, Mutex};

    let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").unwrap());
    let port = server.server_addr().to_ip().unwrap().port();
    let prompts: Arc<Mutex<Vec<String>>> = Arc::default();
    let thread = {
        let (server, prompts) = (Arc::clone(&server), Arc::clone(&prompts));
        std::thread::spawn(move || {
            for mut request in server.incoming_requests() {
                let mut text = String::new();
                request.as_reader().read_to_string(&mut text).unwrap();
                let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                let content = body["messages"][0]["content"].as_str().unwrap_or_default();
                prompts.lock().unwrap().push(content.to_string());
                let reply = serde_json::json!({
                    "choices": [{"message": {"role": "assistant", "content": reply(content)},
                                 "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 50, "completion_tokens": 3},
                });
                let header =
                    tiny_http::Header::from_bytes("Content-Type", "application/json").unwrap();
                let status = match request.url() {
                    "/v1/chat/completions" => 200,
                    _ => 404,
                };
                let _ = request.respond(
                    tiny_http::Response::from_string(reply.to_string())
                        .with_status_code(status)
                        .with_header(header),
                );
            }
        })
    };
    let base = format!("http://127.0.0.1:{port}/v1");
    let model = crate::model_path();
    let o = run(
        dir,
        &[
            "query",
            "talk",
            question,
            "--json",
            "--backend",
            "openai",
            "--base-url",
            &base,
            "--remote-model",
            "stand-in",
            "--tokenizer",
            model.to_str().unwrap(),
        ],
    );
    server.unblock();
    thread.join().unwrap();
    let prompts = prompts.lock().unwrap().clone();
    (json(&o), prompts)
}

/// Notes of many paragraphs, one of which holds the fact.
fn notes() -> String {
    let filler = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/data/filler.txt"),
    )
    .unwrap();
    let paragraphs: Vec<&str> = filler
        .split("\n\n")
        .filter(|p| !p.trim().is_empty())
        .collect();
    let mut text = String::from("# Notes\n\n");
    for (i, p) in paragraphs.iter().cycle().take(30).enumerate() {
        if i == 12 {
            text.push_str(
                "The wifi code at our lake house is pinecone42; the router sits behind the \
                 bookshelf in the hall.\n\n",
            );
        }
        text.push_str(p.trim());
        text.push_str("\n\n");
    }
    text
}

#[test]
fn search_finds_a_passage_by_words_and_by_meaning_with_its_file_and_line() {
    let dir = data_dir("search-find");
    let file = dir.join("notes.md");
    let text = notes();
    std::fs::write(&file, &text).unwrap();
    let ingest = run(
        &dir,
        &["ingest", "notes", file.to_str().unwrap(), "--no-process"],
    );
    assert!(ingest.status.success(), "{}", stderr(&ingest));

    let found = search(&dir, &["notes", "wifi code lake house", "-k", "3"]);
    let top = &found[0];
    assert!(
        top["text"].as_str().unwrap().contains("pinecone42"),
        "{found:#?}"
    );
    // Provenance: the file, the line the passage starts on, and the bytes of the log,
    // which for one ingest are the file's.
    let (start, end) = (top["start"].as_u64().unwrap(), top["end"].as_u64().unwrap());
    assert_eq!(
        &text[start as usize..end as usize],
        top["text"].as_str().unwrap()
    );
    let line = text[..start as usize].matches('\n').count() as u64 + 1;
    assert_eq!(top["line"], line);
    let canonical = std::fs::canonicalize(&file).unwrap();
    assert_eq!(top["source"], canonical.display().to_string());
    assert!(top["version"].is_null(), "no memory has read it yet");

    // A paraphrase shares no word with the passage but stop words: found by meaning.
    let found = search(
        &dir,
        &[
            "notes",
            "How do I get on the internet at the cottage by the lake?",
            "-k",
            "3",
        ],
    );
    assert!(
        found
            .iter()
            .any(|p| p["text"].as_str().unwrap().contains("pinecone42") && p["vector_rank"] == 1),
        "{found:#?}"
    );
    // By words alone, the paraphrase does not bring it first.
    let words = search(
        &dir,
        &[
            "--embedder",
            "none",
            "notes",
            "How do I get on the internet at the cottage by the lake?",
            "-k",
            "1",
        ],
    );
    assert!(
        words.iter().all(|p| p["vector_rank"].is_null()),
        "{words:#?}"
    );

    // Readable output names the file and line.
    let plain = run(&dir, &["search", "notes", "pinecone42", "-k", "1"]);
    let out = String::from_utf8_lossy(&plain.stdout);
    assert!(out.contains(&format!("notes.md:{line}")), "{out}");
}

/// `late_interaction = false` in the configuration: the index keeps no token states
/// (made again from the log when it had them) and passages are found by words and
/// meaning alone; back to the default, they are ranked again by them.
#[test]
fn late_interaction_turned_off_in_the_configuration_keeps_no_token_states() {
    let dir = data_dir("search-late-off");
    let file = dir.join("notes.md");
    std::fs::write(&file, notes()).unwrap();
    let ingest = run(
        &dir,
        &["ingest", "notes", file.to_str().unwrap(), "--no-process"],
    );
    assert!(ingest.status.success(), "{}", stderr(&ingest));
    let config = dir.join("config.toml");
    std::fs::write(&config, "late_interaction = false\n").unwrap();
    let question = "How do I get on the internet at the cottage by the lake?";
    for off in [false, true, false] {
        let mut args = vec!["notes", question, "-k", "3"];
        if off {
            args.extend(["--config", config.to_str().unwrap()]);
        }
        let found = search(&dir, &args);
        assert!(
            found[0]["text"].as_str().unwrap().contains("pinecone42"),
            "off {off}: {found:#?}"
        );
        assert!(
            found.iter().all(|p| p["token_similarity"].is_null() == off),
            "off {off}: {found:#?}"
        );
    }
}

#[test]
fn a_chat_log_ingested_by_hand_becomes_turns_found_with_their_lines() {
    let dir = data_dir("search-chat");
    let log = dir.join("talk.jsonl");
    std::fs::write(
        &log,
        "{\"role\":\"user\",\"content\":\"Hello there.\",\"timestamp\":\"2026-11-20 09:13\"}\n\
         {\"role\": oops}\n\
         {\"role\":\"user\",\"name\":\"Priya\",\"content\":\"my sister Ingrid's birthday is on the 14th of March\"}\n",
    )
    .unwrap();
    let out = run(
        &dir,
        &[
            "ingest",
            "chat",
            log.to_str().unwrap(),
            "--no-process",
            "--json",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("talk.jsonl:2:"), "{}", stderr(&out));
    let found = search(&dir, &["chat", "Ingrid birthday"]);
    let text = found[0]["text"].as_str().unwrap();
    assert!(
        text.starts_with("[2026-11-20 09:13] user: Hello there.\nuser (Priya): my sister Ingrid"),
        "rendered as turns, short turns together: {text}"
    );
    assert_eq!(found[0]["line"], 1);
    assert_eq!(found[0]["time"], "2026-11-20 09:13");
    // --format text keeps the raw lines.
    let raw = run(
        &dir,
        &[
            "ingest",
            "raw",
            log.to_str().unwrap(),
            "--format",
            "text",
            "--no-process",
        ],
    );
    assert!(raw.status.success(), "{}", stderr(&raw));
    let found = search(&dir, &["raw", "Ingrid birthday"]);
    assert!(found[0]["text"]
        .as_str()
        .unwrap()
        .contains("{\"role\":\"user\",\"name\":\"Priya\""));
}

#[test]
fn streams_rm_leaves_no_passage_behind() {
    let dir = data_dir("search-rm");
    for (stream, fact) in [
        ("keep", "The spare key is under the blue pot."),
        ("gone", "The spare key is in the red box."),
    ] {
        let file = dir.join(format!("{stream}.txt"));
        std::fs::write(&file, format!("{fact}\n")).unwrap();
        assert!(run(
            &dir,
            &["ingest", stream, file.to_str().unwrap(), "--no-process"]
        )
        .status
        .success());
    }
    assert_eq!(search(&dir, &["--all", "spare key"]).len(), 2);
    let rm = run(&dir, &["streams", "rm", "gone"]);
    assert!(rm.status.success(), "{}", stderr(&rm));
    let found = search(&dir, &["--all", "spare key"]);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0]["stream"], "keep");
    let status = json(&run(&dir, &["index", "status", "--json"]));
    let streams = status["streams"].as_array().unwrap();
    assert_eq!(streams.len(), 1);
    assert_eq!(streams[0]["passages"], 1);
}

#[test]
fn a_database_from_before_the_index_gains_it_on_open() {
    let dir = data_dir("search-v1");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations/fixtures/v1");
    std::fs::create_dir_all(dir.join("db")).unwrap();
    for entry in std::fs::read_dir(&fixture).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join("db").join(entry.file_name())).unwrap();
    }
    assert!(!dir.join("index").exists());
    let found = search(&dir, &["notes", "what does Ada drink"]);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0]["text"], "Ada prefers tea.\n");
    assert!(
        found[0]["source"].is_null(),
        "written before provenance was kept"
    );
}

#[test]
fn indexing_append_by_append_equals_a_rebuild() {
    let dir = data_dir("search-rebuild");
    let text = notes();
    let file = dir.join("notes.md");
    // The file grows in three pieces, each ingested (and indexed) as it comes.
    let cuts = [text.len() / 3, text.len() * 2 / 3 + 7, text.len()];
    let mut at = 0;
    for cut in cuts {
        let mut cut = cut;
        while !text.is_char_boundary(cut) {
            cut += 1;
        }
        std::fs::write(&file, &text[..cut]).unwrap();
        assert!(run(
            &dir,
            &["ingest", "notes", file.to_str().unwrap(), "--no-process"]
        )
        .status
        .success());
        at = cut;
    }
    assert_eq!(at, text.len());
    let queries = [
        "wifi code",
        "a garden teaches patience",
        "lighthouse keepers",
    ];
    // Every passage, its provenance and its ranks the same. BM25's statistics count
    // passages replaced since the last merge, so the fused scores may differ in their
    // last digits.
    let results = || -> Vec<Vec<Value>> {
        queries
            .iter()
            .map(|q| {
                let mut found = search(&dir, &["notes", q, "-k", "8"]);
                for hit in &mut found {
                    hit.as_object_mut().unwrap().remove("score");
                }
                found
            })
            .collect()
    };
    let before = results();
    let rebuilt = json(&run(&dir, &["index", "rebuild", "--json"]));
    assert_eq!(rebuilt["rebuilt"][0]["bytes"], text.len() as u64);
    assert_eq!(before, results());
}

#[test]
fn query_answers_from_memory_and_cited_passages_within_its_budget() {
    let dir = data_dir("search-query");
    let text = notes();
    // The same fact in a short stream and in one ten times longer.
    let long: String = std::iter::repeat_n(text.as_str(), 10).collect();
    for (stream, body) in [("short", &text), ("long", &long)] {
        let file = dir.join(format!("{stream}.md"));
        std::fs::write(&file, body).unwrap();
        assert!(run(
            &dir,
            &["ingest", stream, file.to_str().unwrap(), "--no-process"]
        )
        .status
        .success());
    }
    let mut prompts = Vec::new();
    for stream in ["short", "long"] {
        let answer = json(&run(
            &dir,
            &[
                "query",
                stream,
                "What is the wifi code at the lake house?",
                "--json",
                "--evidence-tokens",
                "200",
            ],
        ));
        let passages = answer["passages"].as_array().unwrap();
        assert!(!passages.is_empty());
        assert!(
            passages
                .iter()
                .any(|p| p["text"].as_str().unwrap().contains("pinecone42")),
            "{answer:#}"
        );
        assert_eq!(answer["template"]["id"], "memagent-passage-answer");
        assert_eq!(
            answer["version"], 0,
            "no memory yet: answered from the passages"
        );
        let prompt = answer["prompt_tokens"].as_u64().unwrap();
        prompts.push(prompt);
        // One prompt per passage: template, chat wrapping and question take under 150
        // tokens each, beside the 200 tokens of passages they share out.
        assert!(
            prompt <= 200 + 150 * passages.len() as u64,
            "{stream}: {prompt} prompt tokens for {} passages",
            passages.len()
        );
        assert!(
            passages
                .iter()
                .any(|p| p["cited"] == true && p["text"].as_str().unwrap().contains("pinecone42")),
            "the answer cites the passage that says it: {answer:#}"
        );
        assert!(
            answer["answer"].as_str().unwrap().contains("pinecone42"),
            "{answer:#}"
        );
    }
    eprintln!("prompt tokens, short and 10x longer stream: {prompts:?}");
    // --memory-only is the memory's own answer, without passages.
    let out = run(
        &dir,
        &["query", "short", "What is the wifi code?", "--memory-only"],
    );
    assert!(
        !out.status.success(),
        "no memory yet, and --memory-only does not search"
    );
    assert!(stderr(&out).contains("no memory"), "{}", stderr(&out));
}

/// Appends `file` to the stream `notes` (no memory step) and asks about Ingrid.
fn ingest_and_ask(dir: &Path, file: &Path) -> Value {
    assert!(run(
        dir,
        &["ingest", "notes", file.to_str().unwrap(), "--no-process"]
    )
    .status
    .success());
    json(&run(
        dir,
        &[
            "query",
            "notes",
            "Where does my cousin Ingrid live?",
            "--json",
        ],
    ))
}

#[test]
fn a_question_about_a_name_never_stored_is_not_known_without_the_model() {
    let dir = data_dir("search-unknown");
    let file = dir.join("notes.md");
    std::fs::write(&file, notes()).unwrap();
    let answer = ingest_and_ask(&dir, &file);
    assert_eq!(
        answer["answer"], "Not mentioned: nothing stored names Ingrid.",
        "{answer:#}"
    );
    assert_eq!(answer["prompt_tokens"], 0, "no model call: {answer:#}");
    assert_eq!(answer["passages"].as_array().map(Vec::len), Some(0));
    // A name the notes hold is asked of the model, with its passage.
    std::fs::write(
        &file,
        format!("{}\nMy cousin Ingrid lives in Tallinn.\n", notes()),
    )
    .unwrap();
    let answer = ingest_and_ask(&dir, &file);
    assert!(answer["prompt_tokens"].as_u64().unwrap() > 0, "{answer:#}");
    assert!(
        answer["passages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["text"]
                .as_str()
                .unwrap()
                .contains("Ingrid lives in Tallinn")),
        "{answer:#}"
    );
}

#[test]
fn memory_lines_name_the_version_chunk_and_passage_they_came_from() {
    let dir = data_dir("search-sources");
    let file = dir.join("journal.md");
    let mut text = String::new();
    for fact in [
        "Ravi moved to Graz in May and works at the observatory there.",
        "Lena's dog is called Pixel and sleeps under the piano.",
        "The book club meets on Thursdays at the old library.",
    ] {
        text.push_str(fact);
        text.push_str(
            "\n\nThe afternoon was quiet, with tea and a long walk by the river before \
             the rain came in from the hills.\n\n",
        );
    }
    std::fs::write(&file, &text).unwrap();
    let ingest = run(
        &dir,
        &[
            "ingest",
            "notes",
            file.to_str().unwrap(),
            "--writer",
            "lines",
            "--chunk-tokens",
            "48",
            "--memory-tokens",
            "128",
            "--json",
        ],
    );
    assert!(ingest.status.success(), "{}", stderr(&ingest));
    // A line a person adds has no chunk.
    let latest = json(&run(&dir, &["memory", "show", "notes", "--json"]));
    let mut edit = crate::memctl(&dir, &["memory", "edit", "notes"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let edited = format!(
        "{}\nThe spare key hangs in the shed.\n",
        latest["text"].as_str().unwrap()
    );
    std::io::Write::write_all(&mut edit.stdin.take().unwrap(), edited.as_bytes()).unwrap();
    assert!(edit.wait_with_output().unwrap().status.success());

    let shown = json(&run(
        &dir,
        &["memory", "show", "notes", "--sources", "--json"],
    ));
    let history = json(&run(&dir, &["memory", "history", "notes", "--json"]));
    let version = |n: &Value| {
        history
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["version"] == *n)
            .unwrap_or_else(|| panic!("no version {n}"))
            .clone()
    };
    let holds = |v: &Value, line: &str| {
        v["text"].as_str().unwrap().lines().any(|l| {
            l.trim()
                .trim_start_matches(|c: char| c.is_ascii_digit() || c == '.')
                .trim()
                == line
        })
    };
    let sources = shown["sources"].as_array().unwrap();
    assert!(!sources.is_empty(), "{shown:#}");
    let mut with_passage = 0;
    for s in sources {
        let line = s["line"].as_str().unwrap();
        let writer = version(&s["version"]);
        assert!(holds(&writer, line), "v{} lacks {line:?}", s["version"]);
        if let Some(parent) = writer["parent"].as_u64() {
            assert!(
                !holds(&version(&parent.into()), line),
                "{line:?} was older: {s:#}"
            );
        }
        if line == "The spare key hangs in the shed." {
            assert!(s["chunk"].is_null(), "{s:#}");
            assert!(writer["author"]["person"].is_object(), "{writer:#}");
            continue;
        }
        assert_eq!(s["chunk"], writer["chunk"], "{s:#}");
        let (start, end) = (s["start"].as_u64().unwrap(), s["end"].as_u64().unwrap());
        let p = &s["passage"];
        if p.is_object() {
            with_passage += 1;
            let (ps, pe) = (p["start"].as_u64().unwrap(), p["end"].as_u64().unwrap());
            assert!(ps < end && pe > start, "passage outside its chunk: {s:#}");
            assert_eq!(&text[ps as usize..pe as usize], p["text"].as_str().unwrap());
            assert_eq!(
                p["line"],
                text[..ps as usize].matches('\n').count() as u64 + 1
            );
            let quote = s["quote"].as_str().unwrap();
            let head = quote.split(" … ").next().unwrap();
            // The quote is the chunk's: found in the passage from where the chunk starts.
            let from = start.max(ps) as usize;
            let at = from
                + text[from..pe as usize]
                    .find(head)
                    .unwrap_or_else(|| panic!("{quote:?} not in its passage"));
            assert!(
                (at as u64) < end && (at + head.len()) as u64 > start,
                "{s:#}"
            );
            assert_eq!(s["quote_line"], text[..at].matches('\n').count() as u64 + 1);
        }
    }
    assert!(
        with_passage > 0,
        "no model line found its passage: {shown:#}"
    );
    let printed = run(&dir, &["memory", "show", "notes", "--sources"]);
    assert!(printed.status.success(), "{}", stderr(&printed));
    let printed = String::from_utf8_lossy(&printed.stdout);
    assert!(printed.contains("<- memory v"), "{printed}");
    assert!(printed.contains("written by a person"), "{printed}");
}

#[test]
fn a_question_asking_when_gets_the_turn_s_resolved_date_from_every_passage_found() {
    let dir = data_dir("search-when");
    let filler = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/data/filler.txt"),
    )
    .unwrap();
    let sentences: Vec<&str> = filler
        .split(". ")
        .map(str::trim)
        .filter(|s| s.len() > 20)
        .collect();
    // Sittings on six days, two people; the trip is told on the fourth day, the day
    // after it happened, and Porto comes up again later without it.
    let mut log = String::new();
    let mut said = sentences.iter().cycle();
    // The line and time of the turn telling the trip.
    let mut told = (0, String::new());
    for day in 8..14 {
        for (i, name) in ["Ana", "Ben", "Ana", "Ben", "Ana", "Ben"]
            .iter()
            .enumerate()
        {
            let time = format!("2024-03-{day:02} 1{i}:00");
            let content = match (day, i) {
                (11, 2) => {
                    told = (log.lines().count() + 1, time.clone());
                    "I flew to Porto yesterday to see my aunt.".to_string()
                }
                (13, 3) => "Porto has the best pastries, everyone says so.".to_string(),
                _ => format!("{}. {}.", said.next().unwrap(), said.next().unwrap()),
            };
            log.push_str(&chat_line(name, &content, &time));
        }
    }
    ingest_talk(&dir, &log);
    // A budget smaller than any passage: the date is read by code from every passage
    // found, and no model reads them.
    let answer = json(&run(
        &dir,
        &[
            "query",
            "talk",
            "When did Ana fly to Porto?",
            "--json",
            "--evidence-tokens",
            "16",
        ],
    ));
    assert_eq!(answer["answer"], "10 March 2024", "{answer:#}");
    assert_eq!(answer["model_calls"], 0, "{answer:#}");
    let cited: Vec<&str> = answer["passages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["cited"] == true)
        .map(|p| p["text"].as_str().unwrap())
        .collect();
    assert_eq!(cited.len(), 1, "{answer:#}");
    assert!(
        cited[0].contains("(Ana): I flew to Porto yesterday"),
        "{answer:#}"
    );
    // The answer cites the turn itself: its line of the chat log and its time.
    let turn = answer["passages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["cited"] == true)
        .map(|p| p["turn"].clone())
        .unwrap();
    assert_eq!(turn["line"], told.0, "{answer:#}");
    assert_eq!(turn["time"], told.1.as_str(), "{answer:#}");
    let o = run(&dir, &["query", "talk", "When did Ana fly to Porto?"]);
    let printed = String::from_utf8_lossy(&o.stdout);
    assert!(
        printed.contains(&format!("talk.jsonl:{} ({})", told.0, told.1)),
        "{printed}"
    );
}

/// An answer the model reads from a chat passage cites the turn holding the answer's
/// words (then the question's): its line of the chat log and its time, where the
/// passage starts lines and hours earlier. A stand-in for a served model (a loopback
/// server speaking the OpenAI protocol) answers every passage "Graz.".
#[test]
fn an_answer_cites_the_chat_turn_it_reads_from() {
    let dir = data_dir("search-cited-turn");
    let turns = [
        (
            "Ben",
            "Did you hear back about the new job?",
            "2024-03-29 18:00",
        ),
        (
            "Ana",
            "Not yet, but Graz would be lovely.",
            "2024-03-29 18:01",
        ),
        ("Ben", "Fingers crossed for you then.", "2024-03-29 18:02"),
        (
            "Ana",
            "Good news: I moved to Graz for the new job last week.",
            "2024-04-02 09:40",
        ),
        (
            "Ben",
            "Congratulations, that is wonderful!",
            "2024-04-02 09:41",
        ),
    ];
    let log: String = turns
        .iter()
        .map(|(name, content, time)| chat_line(name, content, time))
        .collect();
    ingest_talk(&dir, &log);
    let (answer, _) = query_stand_in(&dir, "Where did Ana move for the new job?", |_| {
        "Graz.".to_string()
    });
    assert_eq!(answer["answer"], "Graz.", "{answer:#}");
    let cited: Vec<&Value> = answer["passages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["cited"] == true)
        .collect();
    assert!(!cited.is_empty(), "{answer:#}");
    // The turn both of Graz and of the new job, not the first one naming Graz.
    let moved = turns.iter().position(|t| t.1.contains("moved")).unwrap();
    let turn = &cited[0]["turn"];
    assert_eq!(turn["line"], moved + 1, "{answer:#}");
    assert_eq!(turn["time"], turns[moved].2, "{answer:#}");
    assert!(
        cited[0]["line"].as_u64().unwrap() < (moved + 1) as u64,
        "{answer:#}"
    );
    // An empty question is an error, as the daemon's API says it, before any model loads.
    let o = run(&dir, &["query", "talk", " "]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("the question is empty"),
        "{}",
        stderr(&o)
    );
    let o = run(&dir, &["query", "talk", "Where did Ana move?", ""]);
    assert!(stderr(&o).contains("question 2 is empty"), "{}", stderr(&o));
}

/// A sitting's turns all carry its time, and an answer's prompt shows it once: on the
/// first turn of the sitting it shows, not on the turns after it (18 of SmolLM2's tokens
/// a turn). The prompts are read where a served model would get them: a loopback server
/// speaking the OpenAI protocol stands in for it.
#[test]
fn an_answer_s_prompt_shows_a_sitting_s_time_once() {
    let dir = data_dir("search-times-once");
    let mut log = String::new();
    let sittings = [
        (
            "2024-03-11 18:30",
            [
                ("Ana", "Did you finish the woodworking class?"),
                ("Ben", "Yes! I made a stool and two shelves."),
                ("Ana", "Nice, what wood did you use for them?"),
                ("Ben", "Oak for the stool, pine for the shelves."),
            ],
        ),
        (
            "2024-03-12 09:15",
            [
                ("Ben", "Morning! The woodworking teacher liked my stool."),
                ("Ana", "Of course she did, it is lovely."),
                ("Ben", "She asked me to teach the next class."),
                ("Ana", "Great news, congratulations!"),
            ],
        ),
    ];
    for (time, turns) in &sittings {
        for (name, content) in turns {
            log.push_str(&chat_line(name, content, time));
        }
    }
    ingest_talk(&dir, &log);

    let (answer, prompts) =
        query_stand_in(&dir, "What did Ben make in the woodworking class?", |_| {
            "A stool.".into()
        });
    let passages: Vec<&str> = prompts
        .iter()
        .filter_map(|p| p.split("Passage: ").nth(1))
        .filter_map(|p| p.split("\n\nAnswer the question").next())
        .collect();
    assert!(!passages.is_empty(), "{answer:#} {prompts:?}");
    let mut turns = 0;
    for passage in &passages {
        for (time, said) in &sittings {
            let shown = said
                .iter()
                .filter(|(name, content)| passage.contains(&format!("user ({name}): {content}")))
                .count();
            turns += shown;
            let stamps = passage.matches(&format!("[{time}] user (")).count();
            assert_eq!(stamps, usize::from(shown > 0), "{time} in {passage}");
        }
    }
    assert!(
        turns > passages.len(),
        "more turns than sittings: {passages:?}"
    );
}

/// A reply that repeats a turn's time says nothing of the question: the passage did not
/// tell, and the answer is "not mentioned" rather than the time.
#[test]
fn an_answer_that_repeats_a_turn_s_time_is_not_an_answer() {
    let dir = data_dir("search-time-repeated");
    let log: String = [
        ("Ana", "How long have you been doing pottery?"),
        ("Ben", "Three years now, and I still love it."),
    ]
    .iter()
    .map(|(name, content)| chat_line(name, content, "2024-03-11 09:40"))
    .collect();
    ingest_talk(&dir, &log);
    // The stand-in answers every passage with the clock of the time it shows.
    let clock = |prompt: &str| -> String {
        let end = prompt.find("] user (").unwrap_or(0);
        format!("{}.", &prompt[end.saturating_sub(5)..end])
    };
    let (answer, prompts) = query_stand_in(&dir, "How long has Ben been doing pottery?", clock);
    let asked: Vec<&String> = prompts.iter().filter(|p| p.contains("Passage: ")).collect();
    assert!(!asked.is_empty(), "{answer:#}");
    for prompt in &asked {
        assert_eq!(clock(prompt), "09:40.", "{prompt}");
    }
    let said = answer["answer"].as_str().unwrap();
    assert!(!said.contains("09:40"), "{answer:#}");
    assert!(said.starts_with("Not mentioned"), "{answer:#}");
}

#[test]
fn rerank_orders_the_passages_found_by_the_question_s_likelihood_added_to_their_score() {
    let dir = data_dir("search-rerank");
    ingest_talk(&dir, &sittings_about_bees());
    let question = "Where does Ana keep her bees?";
    let plain = search(&dir, &["talk", question, "-k", "20"]);
    assert!(plain.len() >= 4, "{plain:?}");
    assert!(plain.iter().all(|p| p.get("likelihood").is_none()));
    let ranked = search(&dir, &["talk", question, "-k", "20", "--rerank", "20"]);
    // The same passages, each scored by the model.
    let key = |p: &Value| p["start"].as_u64().unwrap();
    let mut a: Vec<u64> = plain.iter().map(key).collect();
    let mut b: Vec<u64> = ranked.iter().map(key).collect();
    a.sort_unstable();
    b.sort_unstable();
    assert_eq!(a, b);
    let likelihood = |p: &Value| p["likelihood"].as_f64().expect("a likelihood");
    let scores: Vec<f64> = ranked.iter().map(likelihood).collect();
    assert!(scores.iter().all(|s| *s < 0.0), "{scores:?}");
    // Ordered by the fused score plus the likelihood scaled 0–1 over the passages.
    let low = scores.iter().copied().fold(f64::INFINITY, f64::min);
    let high = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sums: Vec<f64> = ranked
        .iter()
        .map(|p| p["score"].as_f64().unwrap() + (likelihood(p) - low) / (high - low))
        .collect();
    assert!(sums.windows(2).all(|w| w[0] >= w[1]), "{sums:?}");
    // The passage that says where the hives are is likelier to be asked the question
    // than any that mentions neither bees nor hives.
    let says = |p: &Value, w: &str| p["text"].as_str().unwrap().contains(w);
    let answer = ranked.iter().find(|p| says(p, "two hives")).unwrap();
    for other in ranked
        .iter()
        .filter(|p| !says(p, "bees") && !says(p, "hives"))
    {
        assert!(
            likelihood(answer) > likelihood(other),
            "{answer} vs {other}"
        );
    }
    // -k keeps the first of the passages ranked again.
    let first = search(&dir, &["talk", question, "-k", "2", "--rerank", "20"]);
    let firsts: Vec<u64> = first.iter().map(key).collect();
    let want: Vec<u64> = ranked.iter().take(2).map(key).collect();
    assert_eq!(firsts, want);
    // Out of range: a clear error from the flag.
    let o = run(&dir, &["search", "talk", question, "--rerank", "1000"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("from 0 to 200"), "{}", stderr(&o));
}

#[test]
fn a_query_reads_the_passages_ranked_again_and_a_remote_model_cannot_rank_them() {
    let dir = data_dir("query-rerank");
    ingest_talk(&dir, &sittings_about_bees());
    let question = "Where does Ana keep her bees?";
    let answer = json(&run(
        &dir,
        &["query", "talk", question, "--rerank", "20", "--json"],
    ));
    let passages = answer["passages"].as_array().unwrap();
    assert!(!passages.is_empty());
    assert!(
        passages.iter().all(|p| p["likelihood"].as_f64().is_some()),
        "{answer}"
    );
    let plain = json(&run(&dir, &["query", "talk", question, "--json"]));
    let plain = plain["passages"].as_array().unwrap();
    assert!(plain.iter().all(|p| p.get("likelihood").is_none()));
    // A served model's chat completions do not score a given reply: said, not guessed.
    let o = run(
        &dir,
        &[
            "query",
            "talk",
            question,
            "--rerank",
            "5",
            "--backend",
            "openai",
            "--base-url",
            "http://127.0.0.1:9/v1",
            "--remote-model",
            "served",
            "--retries",
            "0",
            "--tokenizer",
            crate::model_path().to_str().unwrap(),
        ],
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("needs the local model"),
        "{}",
        stderr(&o)
    );
}

/// Of the passages that answer a single value, a question of one occasion ("What did Ana
/// bake for Ben's party?") gets the answer of the passage the search ranks first, not a
/// later one about another occasion in as many of the question's words; a question of
/// how things stand now ("What does Ana bake for parties?") gets the newest. A stand-in
/// for a served model (a loopback server speaking the OpenAI protocol) reads each
/// passage's prompt: "A lemon cake." where Ben's party shows, "Rye bread." where the
/// office party does.
#[test]
fn a_question_of_one_occasion_is_answered_from_the_passage_found_first() {
    let dir = data_dir("search-one-occasion");
    ingest_talk(&dir, &sittings_about_baking());
    let reply = |prompt: &str| {
        let said = if prompt.contains("lemon cake for your party") {
            "A lemon cake."
        } else if prompt.contains("rye bread") {
            "Rye bread."
        } else {
            "Not known."
        };
        said.to_string()
    };
    let (answer, prompts) = query_stand_in(&dir, "What did Ana bake for Ben's party?", reply);
    // Both occasions were read and answered: the choice is between them.
    assert!(
        prompts.iter().any(|p| p.contains("rye bread"))
            && prompts
                .iter()
                .any(|p| p.contains("lemon cake for your party")),
        "{prompts:#?}"
    );
    assert_eq!(answer["answer"], "A lemon cake.", "{answer:#}");
    let (answer, _) = query_stand_in(&dir, "What does Ana bake for parties?", reply);
    assert_eq!(answer["answer"], "Rye bread.", "{answer:#}");
}

/// A list question ("What pets does Ana have?") reads its passages a sentence at a time;
/// a sentence said in two sittings is one prompt, and the stand-in (a loopback server
/// speaking the OpenAI protocol) is asked it once.
#[test]
fn a_sentence_said_twice_is_read_once() {
    let dir = data_dir("search-said-twice");
    ingest_talk(&dir, &sittings_about_pets());
    let reply = |prompt: &str| {
        let said = match prompt.contains("dog named Rex") {
            true => "Rex and Mochi.",
            false => "Not known.",
        };
        said.to_string()
    };
    let (answer, prompts) = query_stand_in(&dir, "What pets does Ana have?", reply);
    let asked = prompts
        .iter()
        .filter(|p| p.contains("My pets are a dog named Rex"))
        .count();
    assert_eq!(asked, 1, "{prompts:#?}");
    let mut distinct = prompts.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), prompts.len(), "{prompts:#?}");
    assert!(
        answer["answer"].as_str().unwrap().contains("Rex"),
        "{answer:#}"
    );
    // The calls and tokens counted are those of the prompts read (the stand-in counts
    // 50 tokens a prompt).
    let read = prompts.iter().filter(|p| !p.is_empty()).count();
    assert_eq!(answer["model_calls"], read, "{answer:#}");
    assert_eq!(answer["prompt_tokens"], 50 * read, "{answer:#}");
}
