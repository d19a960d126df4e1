//! The passage index on disk with the real embedder (all-MiniLM-L6-v2, installed by
//! scripts/fetch-model): search by words and by meaning, provenance, catching up piece
//! by piece equal to a rebuild, and hostile logs.

use std::path::PathBuf;
use std::sync::Arc;

use memagent_recall::{
    dot, Embedder, Hit, LogSource, Origin, Recall, SearchRequest, TOKEN_DIMENSIONS,
};

fn embedder() -> Arc<Embedder> {
    Arc::new(loaded())
}

/// The real embedder, loaded anew.
fn loaded() -> Embedder {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/all-MiniLM-L6-v2");
    assert!(
        dir.join("model.safetensors").is_file(),
        "{} is missing: run scripts/fetch-model",
        dir.display()
    );
    Embedder::load(&dir).expect("load the embedder")
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("memagent-recall-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Syncs `log[..len]` as stream 1, with each byte's origin its line in "notes.md".
fn sync(recall: &Recall, log: &[u8], len: usize) {
    let read = |from: u64, to: u64| Ok(log[from as usize..to as usize].to_vec());
    let origin = |at: u64| Origin {
        source: Some("notes.md".into()),
        line: Some(log[..at as usize].iter().filter(|&&b| b == b'\n').count() as u64 + 1),
    };
    let source = LogSource {
        id: 1,
        name: "notes",
        len: len as u64,
        read: &read,
        origin: &origin,
    };
    recall.sync(&source, &mut |_| {}).expect("sync");
}

fn search(recall: &Recall, text: &str, k: usize) -> Vec<Hit> {
    recall
        .search(&SearchRequest {
            text,
            streams: None,
            k,
        })
        .expect("search")
}

fn document() -> String {
    let filler = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/data/filler.txt"),
    )
    .expect("filler");
    let paragraphs: Vec<&str> = filler
        .split("\n\n")
        .filter(|p| !p.trim().is_empty())
        .collect();
    let mut doc = String::new();
    for (i, p) in paragraphs.iter().cycle().take(40).enumerate() {
        if i == 17 {
            doc.push_str(
                "The wifi code at our lake house is pinecone42; the router sits behind the \
                 bookshelf in the hall.\n\n",
            );
        }
        doc.push_str(p.trim());
        doc.push_str("\n\n");
    }
    doc
}

#[test]
fn finds_a_passage_by_words_and_by_paraphrase_with_its_provenance() {
    let dir = temp_dir("find");
    let recall = Recall::open(&dir, Some(embedder())).unwrap();
    let doc = document();
    sync(&recall, doc.as_bytes(), doc.len());

    let hits = search(&recall, "wifi code lake house", 3);
    let top = &hits[0];
    assert!(top.text.contains("pinecone42"), "{hits:#?}");
    assert_eq!(top.bm25_rank, Some(1));
    // Provenance: the byte range holds the text, and the line is the line it starts on.
    assert_eq!(&doc[top.start as usize..top.end as usize], top.text);
    let line = doc[..top.start as usize].matches('\n').count() as u64 + 1;
    assert_eq!(top.line, Some(line));
    assert_eq!(top.source.as_deref(), Some("notes.md"));

    // No word of the question in the passage but stop words: found by meaning.
    let hits = search(
        &recall,
        "How do I get on the internet at the cottage by the lake?",
        3,
    );
    let found = hits.iter().find(|h| h.text.contains("pinecone42"));
    assert!(
        found.is_some_and(|h| h.vector_rank == Some(1)),
        "the paraphrase should rank the passage first by meaning: {hits:#?}"
    );
    // Its words, one by one, are the most like the question's ("wifi" and "router" for
    // "internet", "house" for "cottage"): late interaction keeps it first.
    let late = |h: &Hit| {
        h.token_similarity
            .expect("ranked again by late interaction")
    };
    let best = hits.iter().map(late).fold(f32::MIN, f32::max);
    assert!(
        hits[0].text.contains("pinecone42") && late(&hits[0]) == best,
        "{hits:#?}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn indexing_piece_by_piece_and_after_a_reopen_equals_a_rebuild() {
    let doc = document();
    let pieces = temp_dir("pieces");
    {
        let recall = Recall::open(&pieces, Some(embedder())).unwrap();
        let mut len = 0;
        let n = doc.len();
        for step in [n / 5, 1, n / 40, n / 3, 3] {
            len = (len + step).min(n);
            while !doc.is_char_boundary(len) {
                len += 1;
            }
            sync(&recall, doc.as_bytes(), len);
        }
    }
    // Reopened: it catches up from the state it committed.
    let recall = Recall::open(&pieces, Some(embedder())).unwrap();
    assert!(recall.stream_state(1).len < doc.len() as u64);
    sync(&recall, doc.as_bytes(), doc.len());

    let fresh_dir = temp_dir("fresh");
    let fresh = Recall::open(&fresh_dir, Some(embedder())).unwrap();
    sync(&fresh, doc.as_bytes(), doc.len());
    assert_eq!(
        recall.count(Some(1)).unwrap(),
        fresh.count(Some(1)).unwrap()
    );
    for q in [
        "wifi code",
        "what makes a startup grow",
        "the bookshelf in the hall",
    ] {
        // The same passages in the same order, each ranked the same by words and by
        // meaning. BM25's statistics count passages replaced since the last merge, so
        // the scores themselves may differ in their last digits.
        let ranking = |r: &Recall| -> Vec<_> {
            search(r, q, 10)
                .into_iter()
                .map(|h| (h.start, h.end, h.text, h.bm25_rank, h.vector_rank))
                .collect()
        };
        assert_eq!(
            ranking(&recall),
            ranking(&fresh),
            "results for {q:?} differ from a rebuild's"
        );
    }
    // A reset removes every passage of the stream.
    recall.reset(Some(1)).unwrap();
    assert_eq!(recall.count(Some(1)).unwrap(), 0);
    assert!(search(&recall, "wifi code", 5).is_empty());
    std::fs::remove_dir_all(&pieces).ok();
    std::fs::remove_dir_all(&fresh_dir).ok();
}

#[test]
fn empty_huge_and_invalid_logs_are_indexed_without_failing() {
    let dir = temp_dir("hostile");
    let recall = Recall::open(&dir, Some(embedder())).unwrap();
    sync(&recall, b"", 0);
    assert_eq!(recall.count(None).unwrap(), 0);
    // Invalid UTF-8 in the middle: read as spaces, offsets kept.
    let mut log = b"alpha beta \xff\xfe gamma delta\n".to_vec();
    sync(&recall, &log, log.len());
    let hits = search(&recall, "gamma", 1);
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].end as usize, log.len());
    // One megabyte without a newline: provisional windows, each bounded.
    log.extend(std::iter::repeat_n(b'x', 1 << 20));
    sync(&recall, &log, log.len());
    let n = recall.count(Some(1)).unwrap();
    assert!(n > 100, "{n} passages");
    // Then the line ends and text follows: the windows become final ones, found again.
    log.extend_from_slice(b"\nepsilon zeta\n");
    sync(&recall, &log, log.len());
    let hit = &search(&recall, "epsilon", 1)[0];
    assert!(hit.text.ends_with("epsilon zeta\n"), "{}", hit.text.len());
    assert!(hit.text.len() < 10_000);
    assert!(search(&recall, "gamma", 1)[0].text.contains("gamma"));
    std::fs::remove_dir_all(&dir).ok();
}

/// An index is derived data: one written with another layout (another schema) or of
/// another format (its commit's payload) is made again, empty, and the logs fill it;
/// passages are then found by meaning as in any new index.
#[test]
fn an_index_of_another_layout_or_format_is_made_again_from_the_log() {
    let doc = document();
    let wifi = "What is the password of the internet at the cottage?";
    let found = |recall: &Recall| {
        let hits = search(recall, wifi, 1);
        hits.first().is_some_and(|h| h.text.contains("pinecone42"))
    };
    // Another layout: an index of one text field.
    let dir = temp_dir("other-layout");
    std::fs::create_dir_all(&dir).unwrap();
    {
        let mut b = tantivy::schema::Schema::builder();
        let text = b.add_text_field("text", tantivy::schema::TEXT | tantivy::schema::STORED);
        let index = tantivy::Index::create_in_dir(&dir, b.build()).unwrap();
        let mut writer = index
            .writer::<tantivy::TantivyDocument>(15_000_000)
            .unwrap();
        writer
            .add_document(tantivy::doc!(text => "pinecone42"))
            .unwrap();
        writer.commit().unwrap();
    }
    let recall = Recall::open(&dir, Some(embedder())).unwrap();
    assert_eq!(recall.count(None).unwrap(), 0);
    sync(&recall, doc.as_bytes(), doc.len());
    assert!(recall.count(None).unwrap() > 0);
    assert!(found(&recall));
    drop(recall);
    // Another format: the same layout, the commit's payload of an older format.
    let meta = dir.join("meta.json");
    let mut metas: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&meta).unwrap()).unwrap();
    let mut payload: serde_json::Value =
        serde_json::from_str(metas["payload"].as_str().expect("a payload")).unwrap();
    assert!(
        payload["format"].as_u64().is_some_and(|f| f > 1),
        "{payload}"
    );
    payload["format"] = 1.into();
    metas["payload"] = payload.to_string().into();
    let older = metas.to_string();
    std::fs::write(&meta, older).unwrap();
    let recall = Recall::open(&dir, Some(embedder())).unwrap();
    assert_eq!(recall.count(None).unwrap(), 0);
    sync(&recall, doc.as_bytes(), doc.len());
    assert!(found(&recall));
    std::fs::remove_dir_all(&dir).ok();
}

/// An embedder without token states keeps none in the index and ranks nothing again by
/// them; an index made with the other kind is made again when opened, so that every
/// passage is ranked alike.
#[test]
fn an_index_keeps_token_states_as_its_embedder_does() {
    let doc = document();
    assert!(!embedder_of(false).keeps_token_states() && embedder().keeps_token_states());
    let wifi = "What is the password of the internet at the cottage?";
    let index = temp_dir("token-states");
    for keeps in [false, true, false] {
        let recall = Recall::open(&index, Some(embedder_of(keeps))).unwrap();
        // Made again: empty until the log fills it.
        assert_eq!(recall.count(None).unwrap(), 0, "keeps {keeps}");
        sync(&recall, doc.as_bytes(), doc.len());
        let hits = search(&recall, wifi, 5);
        assert!(hits[0].text.contains("pinecone42"), "keeps {keeps}");
        assert!(hits.iter().all(|h| h.token_similarity.is_some() == keeps));
        drop(recall);
        // Opened again with the same kind, it is kept.
        let again = Recall::open(&index, Some(embedder_of(keeps))).unwrap();
        assert!(again.count(None).unwrap() > 0);
    }
    std::fs::remove_dir_all(&index).ok();
}

/// The real embedder, with or without token states.
fn embedder_of(token_states: bool) -> Arc<Embedder> {
    match token_states {
        true => embedder(),
        false => Arc::new(loaded().without_token_states()),
    }
}

#[test]
fn a_second_writer_is_refused_with_a_clear_error() {
    let dir = temp_dir("lock");
    let _first = Recall::open(&dir, None).unwrap();
    let second = Recall::open(&dir, None);
    let message = second.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("in use"), "{message}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_encoder_gives_the_reference_similarities_whatever_it_is_embedded_with() {
    let e = embedder();
    let question = "Where does my sister Ravi live?";
    let texts = [
        question,
        "My sister Ravi lives in Graz.",
        "Ravi moved to Krakow last month.",
        "Ravi quit and now works as a chef.",
    ];
    let v = e.embed(&texts).unwrap();
    for (i, expected) in [(1, 0.830), (2, 0.541), (3, 0.425)] {
        // candle-transformers' BertModel, mean-pooled, gave these (to 3 decimals).
        let s = memagent_recall::dot(&v[0], &v[i]);
        assert!((s - expected).abs() < 0.002, "{}: {s}", texts[i]);
    }
    for x in &v {
        let norm: f32 = x.iter().map(|a| a * a).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{norm}");
    }
    // Alone or beside others, a text's vector is the same to the last bit: texts of
    // many lengths, packed together over several blocks of rows, against each alone.
    let alone = e.embed(&[texts[2]]).unwrap();
    assert_eq!(alone[0], v[2]);
    let words = document();
    let words: Vec<&str> = words.split_whitespace().collect();
    let many: Vec<String> = (0..24)
        .map(|i| words[i * 7..i * 7 + 1 + (i * 37) % 180].join(" "))
        .chain([String::new()])
        .collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let packed = e.embed(&many).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (text, vector) in many.iter().zip(&packed) {
        let alone = e.embed(&[text]).unwrap();
        assert_eq!(bits(&alone[0]), bits(vector), "{text:?}");
    }
    // The same pass gives each text's telling tokens' states ("sister", "ravi", "live"
    // of the question; not "where", "does", "my" nor "?"), unit length, the same bits
    // packed or alone, and the same vector as `embed`.
    let (tokens, _) = e.embed_tokens_with_stats(&many).unwrap();
    let (question_tokens, _) = e.embed_tokens_with_stats(&[question]).unwrap();
    assert_eq!(question_tokens[0].tokens.len(), 3);
    // A piece said again is merged into one state.
    let (repeated, _) = e
        .embed_tokens_with_stats(&["Ravi, Ravi and Ravi."])
        .unwrap();
    assert_eq!(repeated[0].tokens.len(), 1);
    assert_eq!(bits(&question_tokens[0].vector), bits(&v[0]));
    for ((text, vector), embedded) in many.iter().zip(&packed).zip(&tokens) {
        assert_eq!(bits(&embedded.vector), bits(vector), "{text:?}");
        let (alone, _) = e.embed_tokens_with_stats(&[text]).unwrap();
        let states = |t: &[Vec<f32>]| t.iter().map(|s| bits(s)).collect::<Vec<_>>();
        assert_eq!(
            states(&alone[0].tokens),
            states(&embedded.tokens),
            "{text:?}"
        );
        // Ten words of prose hold a telling one; nothing holds none.
        if text.is_empty() || text.split_whitespace().count() >= 10 {
            assert_eq!(embedded.tokens.is_empty(), text.is_empty(), "{text:?}");
        }
        for s in &embedded.tokens {
            let norm: f32 = s.iter().map(|a| a * a).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-5, "{norm}");
        }
    }
}

/// The default embedder's token states are kept in [`TOKEN_DIMENSIONS`] directions, and
/// in them each of a question's pieces finds the same most similar piece of a passage as
/// in the model's whole states.
#[test]
fn token_states_projected_match_pieces_as_the_whole_states_do() {
    let e = embedder();
    let whole = loaded().without_token_projection();
    assert_eq!(e.token_dimensions(), TOKEN_DIMENSIONS);
    assert_eq!(whole.token_dimensions(), e.dimensions());
    assert!(TOKEN_DIMENSIONS < e.dimensions());
    let question = "Which instrument did my sister Ana learn in Porto?";
    let passage = "[2024-03-11 09:40] user (Ben): Ana took up the cello after her move to \
                   Porto; she practises every evening and her sister sings.";
    let best = |embedder: &Embedder| {
        let (t, _) = embedder
            .embed_tokens_with_stats(&[question, passage])
            .unwrap();
        for s in t.iter().flat_map(|t| &t.tokens) {
            assert_eq!(s.len(), embedder.token_dimensions());
            let norm = dot(s, s).sqrt();
            assert!((norm - 1.0).abs() < 1e-5, "{norm}");
        }
        t[0].tokens
            .iter()
            .map(|q| {
                let sims: Vec<f32> = t[1].tokens.iter().map(|p| dot(q, p)).collect();
                (0..sims.len())
                    .max_by(|&a, &b| sims[a].total_cmp(&sims[b]))
                    .unwrap()
            })
            .collect::<Vec<_>>()
    };
    let projected = best(&e);
    assert!(projected.len() >= 4, "{projected:?}");
    assert_eq!(projected, best(&whole));
}

/// A passage cut inside a long chat turn is dated by that turn's time: its relative
/// dates resolve against it, whether the log was indexed whole or the cut fell at the
/// start of a later sync.
#[test]
fn a_passage_cut_inside_a_turn_is_dated_by_that_turn() {
    let filler: Vec<String> = (0..200).map(|i| format!("tide{i}")).collect();
    let log = format!(
        "[2024-03-10 09:00] user (Ben): How was the week at the harbour?\n\
         [2024-03-11 18:02] user (Ana): {} Then last Friday the old pilot retired.\n\
         [2024-03-11 18:05] user (Ben): Good for him!\n",
        filler.join(" ")
    );
    let cut_inside = log.find("tide180").unwrap();
    for (name, steps) in [
        ("whole", vec![log.len()]),
        ("pieces", vec![cut_inside, log.len()]),
    ] {
        let dir = temp_dir(&format!("inside-turn-{name}"));
        let recall = Recall::open(&dir, Some(embedder())).unwrap();
        for len in steps {
            sync(&recall, log.as_bytes(), len);
        }
        let hits = search(&recall, "When did the old pilot retire?", 3);
        let hit = hits
            .iter()
            .find(|h| h.text.contains("pilot retired"))
            .expect("the passage saying it is found");
        assert!(
            !hit.text.starts_with('['),
            "{name}: cut inside the turn: {}",
            hit.text
        );
        assert_eq!(hit.time.as_deref(), Some("2024-03-11 18:02"), "{name}");
        assert!(
            hit.shown()
                .contains("last Friday [Friday 8 March 2024] the old pilot retired"),
            "{name}: {}",
            hit.shown()
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
