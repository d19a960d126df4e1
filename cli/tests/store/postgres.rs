//! `memctl --database`: streams in a real PostgreSQL server (the one `MEMAGENT_TEST_DATABASE`
//! names; `scripts/test` starts a throwaway one), through the same commands.

use std::os::unix::fs::PermissionsExt;

use super::{data_dir, run, stderr};

fn server() -> String {
    std::env::var("MEMAGENT_TEST_DATABASE").expect(
        "MEMAGENT_TEST_DATABASE is not set: run the tests with scripts/test, which starts a \
         throwaway PostgreSQL, or set it to a server's URL",
    )
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn streams_kept_in_postgresql_are_searched_and_move_to_sled_line_for_line() {
    let url = server();
    let dir = data_dir("postgres-cli");
    // A stream name of this run's own: the server's database is shared.
    let stream = format!("pg-notes-{}", std::process::id());
    let file = dir.join("notes.md");
    std::fs::write(
        &file,
        "The boathouse code is 4471.\n\nAda prefers green tea in the morning.\n",
    )
    .unwrap();
    let pg = |args: &[&str]| {
        let mut all = vec!["--database", url.as_str(), "--embedder", "none"];
        all.extend_from_slice(args);
        run(&dir, &all)
    };
    let out = pg(&["ingest", &stream, file.to_str().unwrap(), "--no-process"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Nothing of it went to the data directory's embedded database.
    assert!(
        !dir.join("db").exists(),
        "the embedded database was created"
    );
    let list = pg(&["streams", "list", "--json"]);
    assert!(stdout(&list).contains(&stream), "{}", stdout(&list));
    let found = pg(&["search", &stream, "boathouse code", "--json"]);
    assert!(found.status.success(), "{}", stderr(&found));
    assert!(stdout(&found).contains("4471"), "{}", stdout(&found));
    // PostgreSQL → an export → sled → an export: the same lines.
    let exported = pg(&["export", &stream]);
    assert!(exported.status.success(), "{}", stderr(&exported));
    let export_file = dir.join("export.jsonl");
    std::fs::write(&export_file, &exported.stdout).unwrap();
    let sled_dir = data_dir("postgres-cli-sled");
    let imported = run(&sled_dir, &["import", export_file.to_str().unwrap()]);
    assert!(imported.status.success(), "{}", stderr(&imported));
    let again = run(&sled_dir, &["export", &stream]);
    assert_eq!(stdout(&again), stdout(&exported));
    let removed = pg(&["streams", "rm", &stream]);
    assert!(removed.status.success(), "{}", stderr(&removed));
    assert!(!stdout(&pg(&["streams", "list", "--json"])).contains(&stream));
}

#[test]
fn a_password_in_a_config_file_others_can_read_is_refused() {
    let dir = data_dir("postgres-secret");
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        "database = \"postgres://memagent:hunter2@127.0.0.1:1/memagent\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = run(
        &dir,
        &["--config", config.to_str().unwrap(), "streams", "list"],
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("chmod 600") && err.contains("PGPASSWORD"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "the password was printed: {err}");
    // Readable by its owner alone, the file is read: the server (nothing on port 1)
    // cannot be reached, and the error says where it looked.
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = run(
        &dir,
        &["--config", config.to_str().unwrap(), "streams", "list"],
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("127.0.0.1:1"), "{err}");
    assert!(!err.contains("hunter2"), "the password was printed: {err}");
}

#[test]
fn bench_shared_steps_every_chunk_once_split_among_the_daemons() {
    let dir = data_dir("bench-shared");
    let out = run(
        &dir,
        &[
            "--database",
            &server(),
            "bench",
            "shared",
            "--daemons",
            "1,2",
            "--streams",
            "8",
            "--chunks",
            "2",
            "--json",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = result["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    // The same text each run: the same steps, at least two a stream.
    let steps: Vec<u64> = runs.iter().map(|r| r["steps"].as_u64().unwrap()).collect();
    assert_eq!(steps[0], steps[1], "{result}");
    assert!(steps[0] >= 16, "{result}");
    for r in runs {
        // Every step taken by one daemon, each daemon counted, none refused by the fence.
        let by: Vec<u64> = r["steps_by_daemon"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap())
            .collect();
        assert_eq!(by.len() as u64, r["daemons"].as_u64().unwrap(), "{r}");
        assert_eq!(by.iter().sum::<u64>(), r["steps"].as_u64().unwrap(), "{r}");
        assert_eq!(r["fenced"], 0, "{r}");
        assert!(r["steps_per_second"].as_f64().unwrap() > 0.0, "{r}");
    }
}
