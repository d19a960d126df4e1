use std::path::PathBuf;
use std::sync::OnceLock;

use memagent_engine::{LoadOptions, LocalModel};

/// The default model: `$MEMAGENT_MODEL`, else the checkout's `models/` folder.
pub fn model_path() -> PathBuf {
    if let Some(p) = std::env::var_os("MEMAGENT_MODEL") {
        return PathBuf::from(p);
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("models")
        .join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.is_file(),
        "default model missing at {}; run scripts/fetch-model (scripts/test does it)",
        p.display()
    );
    p
}

/// One loaded copy of the default model per test binary.
pub fn model() -> &'static LocalModel {
    static MODEL: OnceLock<LocalModel> = OnceLock::new();
    MODEL.get_or_init(|| {
        LocalModel::load(&model_path(), &LoadOptions::default()).expect("load the default model")
    })
}

pub fn reference() -> &'static serde_json::Value {
    static REF: OnceLock<serde_json::Value> = OnceLock::new();
    REF.get_or_init(|| {
        let text = include_str!("../data/smollm2-135m-instruct-q4_1.llamacpp.json");
        serde_json::from_str(text).expect("reference fixture is JSON")
    })
}

pub fn ids(value: &serde_json::Value) -> Vec<u32> {
    value
        .as_array()
        .expect("an array of ids")
        .iter()
        .map(|v| v.as_u64().expect("an id") as u32)
        .collect()
}
